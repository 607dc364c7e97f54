"""The store a stage body sees: every write to its session is fenced by the stage's lease token.

A stage holds its session's lease for its whole body. Wrapping the store means no body can forget
the fence: `transition` on that session is accepted only while the lease still holds this token,
checked in the same WATCH/MULTI as the state check, so a worker that was cut off (or paused) past
its lease can never write its stale outcome over the attempt that took over.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..model import SessionRecord
from .pipeline_store import PipelineStore

# To the type checker a FencedStore is the PipelineStore it stands for (it forwards every other
# attribute to it), so stage bodies keep one store type.
if TYPE_CHECKING:
    _StoreBase = PipelineStore
else:
    _StoreBase = object


class FencedStore(_StoreBase):
    def __init__(self, store: PipelineStore, session_id: str, token: str):
        self._store = store
        self.session_id = session_id
        self.token = token

    def transition(self, session_id: str, new_state: str | None, **kwargs: Any) -> SessionRecord | None:
        if session_id == self.session_id:
            kwargs.setdefault("fence", self.token)
        return self._store.transition(session_id, new_state, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)
