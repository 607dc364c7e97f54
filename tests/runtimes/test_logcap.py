"""Logs a long run writes stay bounded: harness logs of the local and bwrap runtimes and the
process logs of `polar-mq up` rotate at POLAR_LOG_MAX_BYTES, keep POLAR_LOG_BACKUPS old files,
and always keep the newest lines."""

from __future__ import annotations

import re
import shutil
import sys
import time
from pathlib import Path

import pytest

from polar_mq.runtimes.logcap import RotatingLog, total_bytes
from polar_mq.runtimes.bwrap import BwrapRuntime
from polar_mq.runtimes.local import LocalRuntime
from polar_mq.settings import LogSettings
from polar_mq.taskspec import RuntimeSpec
from polar_mq.cli.up import Supervisor

CAP = 64 * 1024
BACKUPS = 2
LINES = 40_000  # ~1.1 MB of output: 17× the cap
PRINT_LINES = f"import sys\nfor i in range({LINES}): sys.stdout.write(f'line {{i:06d}} ' + 'x' * 16 + '\\n')"


def _files(path: Path) -> list[Path]:
    return [path] + sorted(path.parent.glob(path.name + ".*"))


def _check_bounded_and_newest_kept(path: Path) -> None:
    files = _files(path)
    assert len(files) <= BACKUPS + 1, files
    assert all(f.stat().st_size <= CAP for f in files), [f.stat().st_size for f in files]
    assert total_bytes(path) <= (BACKUPS + 1) * CAP
    # oldest file first: together they are the last lines written, in order, none cut
    text = b"".join(f.read_bytes() for f in reversed(files)).decode()
    numbers = [int(n) for n in re.findall(r"^line (\d{6}) x{16}$", text, flags=re.M)]
    assert len(numbers) == text.count("\n")  # every line whole
    assert numbers[-1] == LINES - 1
    assert numbers == list(range(numbers[0], LINES))
    assert len(numbers) * 29 > 2 * CAP  # more than just the current file kept


@pytest.fixture
def capped(monkeypatch):
    monkeypatch.setenv("POLAR_LOG_MAX_BYTES", str(CAP))
    monkeypatch.setenv("POLAR_LOG_BACKUPS", str(BACKUPS))


def test_rotating_log_caps_size_and_keeps_newest_lines(tmp_path):
    log = RotatingLog(tmp_path / "h.log", LogSettings(max_bytes=CAP, backups=BACKUPS))
    for i in range(LINES):
        log.write(f"line {i:06d} {'x' * 16}\n".encode())
    log.close()
    _check_bounded_and_newest_kept(tmp_path / "h.log")
    log.write(b"after close\n")  # a straggler is dropped, never raises
    assert b"after close" not in (tmp_path / "h.log").read_bytes()


def test_one_huge_write_keeps_its_tail(tmp_path):
    log = RotatingLog(tmp_path / "big.log", LogSettings(max_bytes=1000, backups=1))
    log.write(b"".join(f"{i:09d}\n".encode() for i in range(10_000)))  # 100 kB in one chunk
    log.close()
    assert total_bytes(tmp_path / "big.log") <= 2000
    assert (tmp_path / "big.log").read_bytes().endswith(b"000009999\n")


def test_no_cap_means_one_growing_file(tmp_path):
    log = RotatingLog(tmp_path / "a.log", LogSettings(max_bytes=0, backups=2))
    for _ in range(100):
        log.write(b"y" * 1000)
    log.close()
    assert _files(tmp_path / "a.log") == [tmp_path / "a.log"]
    assert (tmp_path / "a.log").stat().st_size == 100_000


def test_local_runtime_harness_log_is_capped(tmp_path, capped):
    rt = LocalRuntime()
    handle = rt.start(RuntimeSpec(backend="local"), tmp_path / "s", "sess-log")
    log_path = tmp_path / "s" / "logs" / "harness-0.log"
    r = rt.exec(handle, [sys.executable, "-c", PRINT_LINES], env={}, timeout=60, log_path=log_path)
    assert r.exit_code == 0, r.output_tail
    _check_bounded_and_newest_kept(log_path)
    assert r.output_tail.rstrip().endswith(f"line {LINES - 1:06d} " + "x" * 16)


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")
def test_bwrap_runtime_harness_log_is_capped(tmp_path, capped):
    rt = BwrapRuntime()
    handle = rt.start(RuntimeSpec(backend="bwrap"), tmp_path / "s", "sess-log-bw")
    log_path = tmp_path / "s" / "logs" / "harness-0.log"
    r = rt.exec(handle, [sys.executable, "-c", PRINT_LINES], env={}, timeout=60, log_path=log_path)
    assert r.exit_code == 0, r.output_tail
    _check_bounded_and_newest_kept(log_path)


def test_up_process_logs_are_capped(tmp_path, capped):
    sup = Supervisor(tmp_path, {})
    child = sup.spawn("gateway", [sys.executable, "-c", PRINT_LINES])
    assert child.proc.wait(timeout=60) == 0
    deadline = time.time() + 10  # the pump thread drains the pipe after the child exits
    while time.time() < deadline and not (tmp_path / "gateway.log").read_bytes().endswith(
            f"line {LINES - 1:06d} {'x' * 16}\n".encode()):
        time.sleep(0.05)
    _check_bounded_and_newest_kept(tmp_path / "gateway.log")
