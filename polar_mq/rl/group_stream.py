"""A trainer's endless stream of finished groups: `Client.groups(...)` returns a `GroupStream`.

It long-polls `GET /v1/groups/next`, then, client-side and by the caller's choice:
- staleness: with `max_staleness=k`, a group sampled by weights older than current − k (current:
  `policy_version=` given by the trainer, an int or a callable, else `GET /v1/admin/status`) is
  dropped (acked with reason "stale", so it never comes back) or, with `stale="keep"`, handed
  out with `group.stale = True`; both counted in `stream.stats`;
- unusable groups: all-ERROR (always, unless `drop_unusable=False`), or — with
  `drop_uniform_reward=True` — all the same reward; acked with reason "unusable" and counted;
- advantages: `advantages="mean_std"|"leave_one_out"` fills `group.advantages` (aligned with
  `group.trajectories`) and `trajectory.metadata["advantage"]`.

Groups handed to the caller are NOT acked: call `stream.ack(group)` after the optimizer step
(`auto_ack=True` acks on hand-out instead). A trainer that dies before acking gets its groups
again once their lease runs out (`group.delivery` > 1).

Tests: tests/api/test_groups.py.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Protocol

from polar_mq.model import Group
from polar_mq.rl.advantages import group_advantages, method_name, unusable_reason


class GroupSource(Protocol):
    """What a stream needs of the rollout API (`polar_mq.client.Client` is one)."""

    def next_groups(self, limit: int = 1, wait: float = 0.0, lease: float = 300.0) -> list[dict[str, Any]]: ...

    def ack_group(self, task_id: str, reason: str | None = None) -> dict[str, Any]: ...

    def admin_status(self) -> dict[str, Any]: ...


@dataclass
class StreamStats:
    delivered: int = 0  # groups received from the API
    yielded: int = 0
    redelivered: int = 0  # received with delivery > 1
    stale_dropped: int = 0
    stale_kept: int = 0
    unusable_dropped: dict[str, int] = field(default_factory=dict)  # reason → count
    acked: int = 0


def staleness(group: Group, current: int | None) -> int | None:
    """How many versions behind the current weights the group was sampled (None: unknown): by
    the oldest version that sampled any token of its trajectories (traces' `policy_versions`),
    else the group's `policy_version`."""
    if current is None:
        return None
    sampled = [v for traj in group.trajectories for tr in traj.traces
               for _off, v in tr.policy_versions or [] if isinstance(v, int)]
    version = min(sampled) if sampled else group.policy_version
    if version is None:
        return None
    return current - version


class GroupStream:
    def __init__(self, client: GroupSource, *, batch: int = 1, wait: float = 30.0, lease: float = 300.0,
                 max_staleness: int | None = None, stale: str = "drop",
                 policy_version: int | Callable[[], int | None] | None = None,
                 drop_unusable: bool = True, drop_uniform_reward: bool = False,
                 advantages: str | None = None, auto_ack: bool = False, max_groups: int | None = None,
                 idle_timeout: float | None = None):
        if stale not in ("drop", "keep"):
            raise ValueError("stale must be 'drop' or 'keep'")
        if max_staleness is not None and max_staleness < 0:
            raise ValueError("max_staleness must be >= 0")
        self.client = client
        self.batch, self.wait, self.lease = batch, wait, lease
        self.max_staleness, self.stale = max_staleness, stale
        self.policy_version = policy_version
        self.drop_unusable, self.drop_uniform_reward = drop_unusable, drop_uniform_reward
        self.advantages = method_name(advantages) if advantages else None
        self.auto_ack = auto_ack
        self.max_groups = max_groups
        self.idle_timeout = idle_timeout
        self.stats = StreamStats()

    # --- what the trainer calls -----------------------------------------------------------------
    def __iter__(self) -> Iterator[Group]:
        idle_since = time.monotonic()
        while self.max_groups is None or self.stats.yielded < self.max_groups:
            want = self.batch if self.max_groups is None else min(self.batch, self.max_groups - self.stats.yielded)
            raw = self.client.next_groups(limit=want, wait=self.wait, lease=self.lease)
            if not raw:
                if self.idle_timeout is not None and time.monotonic() - idle_since >= self.idle_timeout:
                    return
                continue
            idle_since = time.monotonic()
            current = self.current_version() if self.max_staleness is not None else None
            for data in raw:
                group = self.accept(Group.from_dict(data), current)
                if group is not None:
                    self.stats.yielded += 1
                    yield group

    def next_batch(self, n: int, timeout: float | None = None) -> list[Group]:
        """Up to n usable groups (fewer if `timeout` seconds pass first)."""
        out: list[Group] = []
        deadline = None if timeout is None else time.monotonic() + timeout
        while len(out) < n:
            wait = self.wait if deadline is None else max(0.0, min(self.wait, deadline - time.monotonic()))
            raw = self.client.next_groups(limit=n - len(out), wait=wait, lease=self.lease)
            current = self.current_version() if (raw and self.max_staleness is not None) else None
            for data in raw:
                group = self.accept(Group.from_dict(data), current)
                if group is not None:
                    self.stats.yielded += 1
                    out.append(group)
            if deadline is not None and time.monotonic() >= deadline:
                break
        return out

    def ack(self, group: Group | str, reason: str = "trained") -> None:
        self.client.ack_group(group if isinstance(group, str) else group.task_id, reason=reason)
        self.stats.acked += 1

    # --- the filters ----------------------------------------------------------------------------
    def current_version(self) -> int | None:
        pv = self.policy_version
        if callable(pv):
            return pv()
        if pv is not None:
            return int(pv)
        return self.client.admin_status().get("policy_version")

    def accept(self, group: Group, current: int | None) -> Group | None:
        """The group as handed to the trainer, or None when it was dropped (and acked)."""
        self.stats.delivered += 1
        if group.delivery > 1:
            self.stats.redelivered += 1
        behind = staleness(group, current)
        if self.max_staleness is not None and behind is not None and behind > self.max_staleness:
            if self.stale == "drop":
                self.stats.stale_dropped += 1
                self.ack(group, reason="stale")
                return None
            group.stale = True
            self.stats.stale_kept += 1
        if self.drop_unusable:
            why = unusable_reason([s.state for s in group.sessions], group.rewards,
                                  drop_uniform_reward=self.drop_uniform_reward)
            if why is not None:
                self.stats.unusable_dropped[why] = self.stats.unusable_dropped.get(why, 0) + 1
                self.ack(group, reason="unusable")
                return None
        if self.advantages:
            group.advantages = group_advantages(group.rewards, self.advantages)
            for traj, adv in zip(group.trajectories, group.advantages):
                traj.metadata["advantage"] = adv
        if self.auto_ack:
            self.ack(group)
        return group
