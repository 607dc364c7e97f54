"""Harness output through the size-capped log (a pipe pumped into logcap.RotatingLog) vs the
child writing its log file directly (no cap: the baseline).

Runs the same output-heavy commands both ways, alternating, and prints seconds, MB/s and the
capped/direct ratio side by side, plus the bytes each way leaves on disk:
  * `bulk`: 256 MB of `yes` output in big writes (the worst case for the pump),
  * `lines`: one million short lines printed by Python (a chatty harness or test run).

    python bench/bench_logcap.py [--mb 256] [--lines 1000000] [--cap-mb 64] [-n 3]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from polar_mq.runtimes.logcap import RotatingLog, pump, total_bytes  # noqa: E402
from polar_mq.settings import LogSettings  # noqa: E402


def direct(argv: list[str], log_path: Path) -> float:
    t0 = time.perf_counter()
    with open(log_path, "ab") as log:
        subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, check=True)
    return time.perf_counter() - t0


def capped(argv: list[str], log_path: Path, limits: LogSettings) -> float:
    t0 = time.perf_counter()
    log = RotatingLog(log_path, limits)
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    thread = pump(proc.stdout, log)  # type: ignore[arg-type]
    proc.wait()
    thread.join()
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=256)
    ap.add_argument("--lines", type=int, default=1_000_000)
    ap.add_argument("--cap-mb", type=int, default=64)
    ap.add_argument("-n", type=int, default=3)
    args = ap.parse_args()
    limits = LogSettings(max_bytes=args.cap_mb * 1024 * 1024, backups=2)
    workloads = {
        "bulk": (["sh", "-c", f"yes polar-mq-log-line | head -c {args.mb * 1024 * 1024}"], args.mb * 1024 * 1024),
        "lines": ([sys.executable, "-c", f"for i in range({args.lines}): print('step', i, 'ok')"], None),
    }
    print(f"cap {args.cap_mb} MiB × 3 files; median of {args.n} runs each, alternating")
    print(f"{'workload':8} {'direct s':>9} {'capped s':>9} {'ratio':>6} {'MB/s direct':>12} {'MB/s capped':>12}"
          f" {'disk direct':>12} {'disk capped':>12}")
    with tempfile.TemporaryDirectory() as tmp:
        for name, (argv, _) in workloads.items():
            d_times, c_times = [], []
            d_disk = c_disk = written = 0
            for i in range(args.n):
                dp, cp = Path(tmp) / f"{name}-d{i}.log", Path(tmp) / f"{name}-c{i}.log"
                d_times.append(direct(argv, dp))
                c_times.append(capped(argv, cp, limits))
                written, d_disk, c_disk = dp.stat().st_size, dp.stat().st_size, total_bytes(cp)
                for f in Path(tmp).glob("*.log*"):
                    f.unlink()
            d, c = statistics.median(d_times), statistics.median(c_times)
            mb = written / 1e6
            print(f"{name:8} {d:9.3f} {c:9.3f} {c / d:6.2f} {mb / d:12.1f} {mb / c:12.1f}"
                  f" {d_disk / 1e6:10.1f}MB {c_disk / 1e6:10.1f}MB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
