"""The memory a worker pool holds: PSS of its processes, read one way by the CI test and the soak.

PSS (proportional set size, `/proc/<pid>/smaps_rollup`) charges a page shared by k processes 1/k
to each, so a prefork pool's forks are not counted k times over for the interpreter they share and
a threads pool's one process is counted whole. Used by tests/pipeline/test_run_slots.py and
bench/bench_soak.py (tests/pipeline/test_run_slots.py::test_pool_pids_and_pss guards both).
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def pool_pids(main_pid: int) -> list[int]:
    """A Celery worker's main process and its pool children. prefork's forks share the main
    process's cmdline; harnesses, which are its children too, do not, and are not the pool."""
    main_cmd = _cmdline(main_pid)
    try:
        children = Path(f"/proc/{main_pid}/task/{main_pid}/children").read_text().split()
    except OSError:
        children = []
    return [main_pid] + [int(c) for c in children if _cmdline(int(c)) == main_cmd]


def pss_kib(pid: int) -> int:
    """One process's PSS in KiB (0 when it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def pss_mib(pids: Iterable[int]) -> float:
    """The summed PSS of `pids` in MiB (processes that are gone count 0)."""
    return sum(pss_kib(pid) for pid in pids) / 1024
