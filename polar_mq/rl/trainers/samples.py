"""A polar_mq group -> rows a policy-gradient trainer can use directly.

A group (``GET /v1/groups/next``, see CONTRACT "Groups for trainers") holds one task's sessions and
their trajectories. Each trace of a usable trajectory becomes one ``TrainSample``: the prompt ids,
the response ids with their loss mask (1 = sampled by the policy, 0 = tool results and template
glue that prefix_merging spliced in), the logprobs the sampling engine reported for those ids
(the behaviour policy of the importance ratio; 0.0 where the mask is 0), the trajectory's reward,
and the group-relative advantage.

Which trajectories are usable: a session that ended ERROR (or a trajectory whose reward is None:
the grader could not say) is left out and does not count towards the group's baseline; a
TIMEOUT keeps its reward (the grader scored what was done). A group with fewer than two usable
trajectories, or (``drop_constant``) with one reward for all, teaches GRPO nothing and yields no
rows (``GroupBatch.skipped`` says why).

Tests: tests/rl/test_trainer_mappings.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

from polar_mq.rl.advantages import group_advantages, method_name
from polar_mq.model import Group


@dataclass
class TrainSample:
    prompt_ids: list[int]
    response_ids: list[int]
    loss_mask: list[int]
    behaviour_logprobs: list[float]
    reward: float
    advantage: float
    group_id: str
    session_id: str
    policy_version: int | None = None
    trace_index: int = 0
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def trained_tokens(self) -> int:
        return sum(self.loss_mask)

    @property
    def input_ids(self) -> list[int]:
        return self.prompt_ids + self.response_ids


@dataclass
class GroupBatch:
    group_id: str
    samples: list[TrainSample]
    rewards: list[float]
    policy_version: int | None
    skipped: str | None = None  # why the group gave no rows (None: it gave some)
    dropped_sessions: list[str] = field(default_factory=list)  # ERROR / ungraded, left out
    oldest_version: int | None = None  # the oldest policy that sampled any token of the group


def _usable(traj: dict[str, Any], session_states: dict[str, str]) -> bool:
    if traj.get("reward") is None:
        return False
    state = session_states.get(traj.get("session_id", ""), traj.get("status"))
    return state != "ERROR" and traj.get("status") != "ERROR"


def _trace_version(trace: dict[str, Any], traj: dict[str, Any], group: dict[str, Any]) -> int | None:
    for meta in (trace.get("metadata") or {}, traj.get("metadata") or {}):
        if isinstance(meta.get("policy_version"), int):
            return meta["policy_version"]
    v = group.get("policy_version")
    return v if isinstance(v, int) else None


STALE_TOKENS = ("drop", "mask", "keep")


def oldest_version(traj: dict[str, Any]) -> int | None:
    """The oldest policy version that sampled any token of a trajectory (its traces'
    `policy_versions`): what a group's staleness is measured by."""
    versions = [v for tr in traj.get("traces") or [] for _off, v in tr.get("policy_versions") or []
                if isinstance(v, int)]
    return min(versions) if versions else None


def _stale_mask(tr: dict[str, Any], mask: list[int], current: int | None, how: str) -> list[int] | None:
    """`mask` with the tokens sampled by an older version than `current` handled as `how`:
    keep (unchanged), mask (loss 0), drop (None: the trace gives no sample)."""
    pairs = [p for p in tr.get("policy_versions") or [] if isinstance(p[1], int)]
    if how == "keep" or current is None or not pairs or all(v >= current for _o, v in pairs):
        return mask
    if how == "drop":
        return None
    out = list(mask)
    bounds = [int(o) for o, _v in tr["policy_versions"]] + [len(mask)]
    for (off, v), end in zip(tr["policy_versions"], bounds[1:]):
        if isinstance(v, int) and v < current:
            out[int(off):end] = [0] * (end - int(off))
    return out


def as_dict(group: Group | dict[str, Any]) -> dict[str, Any]:
    return group.to_dict() if isinstance(group, Group) else group


def samples_from_group(group: Group | dict[str, Any], *, advantage: str = "mean_std",
                       drop_constant: bool = True, min_usable: int = 2,
                       stale_tokens: str = "keep", current_version: int | None = None) -> GroupBatch:
    """The rows of one group (a ``polar_mq.model.Group`` or its JSON dict; see the module
    docstring). ``advantage``: ``mean_std`` (GRPO) or ``leave_one_out`` (RLOO), computed by
    ``polar_mq.rl.advantages`` over the usable trajectories only. ``stale_tokens``: what to do with
    the tokens a trace's ``policy_versions`` says an older policy than ``current_version`` (default:
    the newest version in the group) sampled: ``keep`` them, ``mask`` them (loss 0) or ``drop``
    the trace. ``GroupBatch.oldest_version``: the oldest version that sampled any token."""
    group = as_dict(group)
    method_name(advantage)  # a clear error for an unknown method, before any work
    if stale_tokens not in STALE_TOKENS:
        raise ValueError(f"stale_tokens must be one of {', '.join(STALE_TOKENS)}, got {stale_tokens!r}")
    gid = str(group.get("task_id"))
    states = {s.get("session_id"): s.get("state") for s in group.get("sessions") or []}
    trajs = list(group.get("trajectories") or [])
    usable = [t for t in trajs if _usable(t, states)]
    dropped = [t.get("session_id") for t in trajs if t not in usable]
    rewards = [float(t["reward"]) for t in usable]
    version = group.get("policy_version") if isinstance(group.get("policy_version"), int) else None
    newest = [int(v) for t in trajs for tr in t.get("traces") or []
              for _o, v in tr.get("policy_versions") or [] if isinstance(v, int)]
    current = current_version if current_version is not None else (max(newest) if newest else None)
    oldest = [v for v in (oldest_version(t) for t in trajs) if v is not None]
    out = GroupBatch(gid, [], rewards, version, dropped_sessions=dropped,
                     oldest_version=min(oldest) if oldest else None)
    if len(usable) < min_usable:
        out.skipped = f"{len(usable)} usable trajectories (< {min_usable})"
        return out
    if drop_constant and max(rewards) - min(rewards) < 1e-12:
        out.skipped = f"every usable trajectory has reward {rewards[0]:g}"
        return out
    for traj, adv in zip(usable, group_advantages(rewards, advantage)):
        adv = 0.0 if adv is None else adv
        for i, tr in enumerate(traj.get("traces") or []):
            resp = list(tr["response_ids"])
            kept = _stale_mask(tr, [int(m) for m in tr["loss_mask"]], current, stale_tokens)
            if kept is None:
                continue
            mask = kept
            lps = tr.get("response_logprobs")
            if len(mask) != len(resp) or (lps is not None and len(lps) != len(resp)):
                raise ValueError(f"group {gid} session {traj.get('session_id')} trace {i}: "
                                 f"response_ids/loss_mask/logprobs lengths differ")
            if lps is None and any(mask):
                raise ValueError(f"group {gid} session {traj.get('session_id')} trace {i}: no response_logprobs "
                                 f"(the behaviour policy is needed for the importance ratio)")
            out.samples.append(TrainSample(
                prompt_ids=list(tr["prompt_ids"]), response_ids=resp, loss_mask=mask,
                behaviour_logprobs=[float(x) for x in (lps or [0.0] * len(resp))],
                reward=float(traj["reward"]), advantage=float(adv), group_id=gid,
                session_id=str(traj.get("session_id")), policy_version=_trace_version(tr, traj, group),
                trace_index=i, metadata=dict(tr.get("metadata") or {})))
    return out


def batches_from_groups(groups: Iterable[dict[str, Any]], **kwargs: Any) -> list[GroupBatch]:
    return [samples_from_group(g, **kwargs) for g in groups]
