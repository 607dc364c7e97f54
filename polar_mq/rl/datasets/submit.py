"""Submit built tasks with per-row outcomes: created, existing (an identical resubmit: nothing
new), or the row's error (invalid row, a task id already used with a different body → 409).
A few requests in flight at once; outcomes come back in row order."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterable

from polar_mq.rl.datasets.build import BuiltTask

if TYPE_CHECKING:  # pragma: no cover
    from polar_mq.client import Client

PARALLEL = 8


@dataclass
class RowOutcome:
    row: int
    task_id: str | None
    status: str  # created | existing | error
    error: str | None = None
    session_ids: list[str] | None = None


def submit_built(client: "Client", built: Iterable[BuiltTask], *,
                 on_done: Callable[[RowOutcome], None] | None = None, parallel: int = PARALLEL) -> list[RowOutcome]:
    from polar_mq.client import ApiError

    def one(item: BuiltTask) -> RowOutcome:
        if item.task is None:
            out = RowOutcome(item.row, None, "error", item.error)
        else:
            try:
                body, created = client.submit_checked(item.task)
                out = RowOutcome(item.row, body["task_id"], "created" if created else "existing",
                                 session_ids=body.get("session_ids"))
            except ApiError as exc:
                out = RowOutcome(item.row, item.task_id, "error", str(exc))
        if on_done is not None:
            on_done(out)
        return out

    items = list(built)
    with ThreadPoolExecutor(max_workers=max(1, parallel)) as pool:
        return list(pool.map(one, items))
