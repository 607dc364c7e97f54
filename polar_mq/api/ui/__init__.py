"""The trajectory viewer under `/ui/` (docs/viewer.md): routes, browser sign-in, views, and the
gateway session lookups it needs."""

from __future__ import annotations

from polar_mq import _forward

__getattr__ = _forward(__name__, "polar_mq.api.ui.routes")
