"""What workers run: the stages (init -> READY -> run -> postrun), the janitor, recovery, leases,
fencing, the cancel watch and the worker entry point (`main`)."""

from __future__ import annotations

from polar_mq import _forward

__getattr__ = _forward(__name__, "polar_mq.tasks.worker.main")
