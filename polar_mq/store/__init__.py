"""Everything that knows a Redis key or byte: key names and the store (`core`), the record codec
(`codec`), the wire client (`wire`), typed replies, pipeline state, groups, pause, histograms and
retention. `from polar_mq.store import Keys, ...` keeps working: names resolve to `core`."""

from __future__ import annotations

from polar_mq import _forward

__getattr__ = _forward(__name__, "polar_mq.store.core")
