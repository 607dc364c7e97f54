"""How many sessions a worker host holds at once, and in what kind of pool: sized from the host.

A run slot only supervises a harness process (waits on its pidfd, pumps its output, renews a
lease), so the stage pools default to Celery's ``threads`` pool: a slot is a thread of one worker
process (tens of KiB) instead of a forked process of its own (~38 MiB of PSS each under
``prefork``). ``prefork`` stays available (``--pool prefork`` / ``POLAR_CELERY_POOL=prefork``)
for work that needs a process per slot, e.g. CPU-bound Python graders in postrun.

The sizes below are what `polar-mq worker`, `polar-mq up`, workers/ and compose use when no
``POLAR_<STAGE>_CONCURRENCY`` / ``--<stage>-concurrency`` is given
(tests/pipeline/test_run_slots.py::test_host_sizing guards the formulas; docs/deployment.md the figures).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping

DEFAULT_POOL = "threads"
POOLS = ("threads", "prefork", "solo", "gevent", "eventlet")
# The pools that keep every slot in the worker's own process (one supervisor process per host).
THREADED_POOLS = frozenset({"threads", "gevent", "eventlet", "solo"})
# prefork's sizes when it is asked for: a process per slot, so the old small defaults.
PREFORK_CONCURRENCY = {"init": 2, "run": 4, "postrun": 2}


@dataclass(frozen=True)
class Host:
    cores: int
    memory_gib: float

    def describe(self) -> str:
        return f"{self.cores} cores, {self.memory_gib:.1f} GiB"


def _cgroup_memory_bytes() -> int | None:
    """The cgroup v2 memory limit of this process (a container's), None when unlimited/absent."""
    try:
        text = open("/sys/fs/cgroup/memory.max").read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def host() -> Host:
    """This host's cores (the CPUs this process may run on) and memory (MemTotal, or a lower
    cgroup limit: a container sized smaller than its machine is sized by its limit)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    mem = 0
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    mem = int(line.split()[1]) * 1024
                    break
    except OSError:
        pass
    limit = _cgroup_memory_bytes()
    if limit and (not mem or limit < mem):
        mem = limit
    return Host(cores=max(1, cores), memory_gib=(mem or 4 << 30) / (1 << 30))


def concurrency_for(stage: str, pool: str, h: Host) -> int:
    """The slots of `stage` on host `h` under `pool`.

    threads: run = min(256, max(8, 16 × GiB)) — a slot costs ~0.1 MiB of supervisor and the
    harness it runs is what needs the memory, so 16 per GiB leaves ~64 MiB per harness; init
    (runtime start, prepare steps: mostly waiting on processes) = min(64, max(4, 4 × cores));
    postrun (trajectory build, grading: partly CPU under one GIL) = min(32, max(2, 2 × cores)).
    prefork: the process-per-slot sizes, run = min(64, max(4, 2 × cores))."""
    if pool in THREADED_POOLS and pool != "solo":
        if stage == "run":
            return int(min(256, max(8, h.memory_gib * 16)))
        if stage == "init":
            return min(64, max(4, 4 * h.cores))
        return min(32, max(2, 2 * h.cores))
    if pool == "solo":
        return 1
    if stage == "run":
        return min(64, max(PREFORK_CONCURRENCY["run"], 2 * h.cores))
    return PREFORK_CONCURRENCY[stage]


def pool_for(stage: str, env: Mapping[str, str]) -> str:
    """``POLAR_<STAGE>_POOL``, else ``POLAR_CELERY_POOL``, else threads."""
    return env.get(f"POLAR_{stage.upper()}_POOL") or env.get("POLAR_CELERY_POOL") or DEFAULT_POOL


def sizing(stage: str, env: Mapping[str, str], h: Host | None = None) -> tuple[str, int, str]:
    """(pool, concurrency, why): the environment's choice, else the host's."""
    pool = pool_for(stage, env)
    given = env.get(f"POLAR_{stage.upper()}_CONCURRENCY")
    if given:
        return pool, int(given), f"POLAR_{stage.upper()}_CONCURRENCY"
    h = h or host()
    return pool, concurrency_for(stage, pool, h), f"sized from the host ({h.describe()})"


FDS_PER_SLOT = 8  # a harness's output pipe, its pidfd, its log file, Redis/HTTP connections, slack


def raise_fd_limit(slot_count: int) -> tuple[int, int]:
    """Raise this process's soft open-files limit toward its hard limit so `slot_count` slots of
    one process fit (a common soft default, 1024, is ~128 slots); returns (soft before, after).
    The harnesses inherit the raised limit, as they would a shell's."""
    from polar_mq._io.fdlimit import raise_nofile

    return raise_nofile(256 + FDS_PER_SLOT * slot_count)
