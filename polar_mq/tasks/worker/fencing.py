"""The store a stage body sees: every write to its session is fenced by the stage's lease token.

A stage holds its session's lease for its whole body. Wrapping the store means no body can forget
the fence: `transition` on that session is accepted only while the lease still holds this token,
checked in the same WATCH/MULTI as the state check, so a worker that was cut off (or paused) past
its lease can never write its stale outcome over the attempt that took over.

Tests: tests/pipeline/test_fencing_recovery.py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from polar_mq.model import SessionRecord
from polar_mq.store.pipeline import PipelineStore

# To the type checker a FencedStore is the PipelineStore it stands for (it forwards every other
# attribute to it), so stage bodies keep one store type.
if TYPE_CHECKING:
    _StoreBase = PipelineStore
else:
    _StoreBase = object


class FencedStore(_StoreBase):
    def __init__(self, store: PipelineStore, session_id: str, token: str,
                 on_release: Callable[[], None] | None = None):
        self._store = store
        self.session_id = session_id
        self.token = token
        self._on_release = on_release

    def transition(self, session_id: str, new_state: str | None, **kwargs: Any) -> SessionRecord | None:
        """`release=True` (a stage's last write) drops the lease in the same script; the lease
        is then told it has nothing left to release or renew."""
        if session_id != self.session_id:
            kwargs.pop("release", None)  # only this stage's own lease
            return self._store.transition(session_id, new_state, **kwargs)
        kwargs.setdefault("fence", self.token)
        rec = self._store.transition(session_id, new_state, **kwargs)
        if rec is not None and kwargs.get("release") and self._on_release is not None:
            self._on_release()
        return rec

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)
