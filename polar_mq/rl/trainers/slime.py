"""A polar_mq group -> slime ``Sample`` objects (``slime.utils.types.Sample``).

Field mapping, per trace of each usable trajectory (``samples.samples_from_group``):

=====================  ===============================================================
slime ``Sample``        from polar_mq
=====================  ===============================================================
``group_index``         the group's position in the batch (``group_index=`` argument)
``index``               a running sample index (``start_index=`` + position)
``prompt``              the trace's ``messages`` up to the first assistant turn
``tokens``              ``prompt_ids + response_ids`` (slime keeps prompt and response
                        in one list)
``response_length``     ``len(response_ids)``
``response``            the assistant text of the trace's last message (informational)
``loss_mask``           the trace's ``loss_mask`` (1 = sampled by the policy; 0 = tool
                        results / template glue spliced in by prefix_merging)
``rollout_log_probs``   ``response_logprobs`` (0.0 where the mask is 0)
``reward``              the trajectory's reward (the grader's)
``weight_versions``     ``[str(policy_version)]`` of the weights that sampled it
``status``              COMPLETED; TRUNCATED when the trace's finish_reason is "length"
``session_id``          the polar_mq session id (slime routes by it too)
``metadata``            trace metadata + ``group_id``, ``advantage`` (GRPO's, for reference:
                        slime computes its own from the rewards of a group)
=====================  ===============================================================

slime's entry point for a custom rollout is ``--rollout-function-path module.fn`` with
``fn(args, rollout_id, data_source, evaluation=False)`` returning a list of groups (each a list of
``Sample``). ``generate_rollout`` below is that function over polar_mq: it takes finished groups
from the groups API (``POLAR_API_URL``) and maps them. Run here: the field mapping on real
trajectories (tests/rl/test_trainer_mappings.py); NOT run: slime itself (it needs Megatron/SGLang
and GPUs), so the ``Sample`` class is imported only when slime is installed, and without it the
same fields come back as dicts (``as_dicts=True``).
"""

from __future__ import annotations

from typing import Any

from polar_mq.model import Group
from polar_mq.rl.trainers.samples import samples_from_group


def _prompt_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for m in messages or []:
        if m.get("role") == "assistant":
            break
        out.append(m)
    return out


def _response_text(messages: list[dict[str, Any]]) -> str:
    for m in reversed(messages or []):
        if m.get("role") == "assistant" and isinstance(m.get("content"), str):
            return m["content"]
    return ""


def sample_fields(group: Group | dict[str, Any], *, group_index: int = 0, start_index: int = 0,
                  advantage: str = "mean_std") -> list[dict[str, Any]]:
    """The slime ``Sample`` fields of every usable trace of ``group`` (see the module table)."""
    batch = samples_from_group(group, advantage=advantage, drop_constant=False)
    g = group.to_dict() if isinstance(group, Group) else group
    traces = {(t["session_id"], i): tr for t in g.get("trajectories") or []
              for i, tr in enumerate(t.get("traces") or [])}
    out = []
    for k, s in enumerate(batch.samples):
        tr = traces[(s.session_id, s.trace_index)]
        out.append({
            "group_index": group_index, "index": start_index + k,
            "prompt": _prompt_messages(tr.get("messages") or []),
            "tokens": s.prompt_ids + s.response_ids, "response_length": len(s.response_ids),
            "response": _response_text(tr.get("messages") or []),
            "loss_mask": list(s.loss_mask), "rollout_log_probs": list(s.behaviour_logprobs),
            "reward": s.reward,
            "weight_versions": [] if s.policy_version is None else [str(s.policy_version)],
            "status": "truncated" if tr.get("finish_reason") == "length" else "completed",
            "session_id": s.session_id,
            "metadata": {**s.metadata, "group_id": s.group_id, "advantage": s.advantage},
        })
    return out


def to_samples(group: Group | dict[str, Any], *, as_dicts: bool = False, **kwargs: Any) -> list[Any]:
    """slime ``Sample`` objects (or, ``as_dicts``/no slime installed, their field dicts)."""
    fields = sample_fields(group, **kwargs)
    if as_dicts:
        return fields
    try:
        from slime.utils.types import Sample  # type: ignore[import-not-found]
    except ImportError:
        return fields
    return [Sample.from_dict(f) for f in fields]


def generate_rollout(args: Any, rollout_id: int, data_source: Any = None, evaluation: bool = False) -> list[list[Any]]:
    """slime's ``--rollout-function-path`` over polar_mq: ``args.rollout_batch_size`` finished
    groups from the groups API (tasks submitted separately, e.g. ``polar-mq submit --dataset``),
    acked once mapped. ``data_source`` is unused: the prompts live in polar_mq's tasks."""
    from polar_mq.client import Client

    client = Client()
    want = int(getattr(args, "rollout_batch_size", 1))
    groups: list[dict[str, Any]] = []
    while len(groups) < want:
        groups += client.next_groups(limit=want - len(groups), wait=30.0)
    out, index = [], 0
    for gi, g in enumerate(groups):
        samples = to_samples(g, group_index=gi, start_index=index)
        index += len(samples)
        out.append(samples)
        client.ack_group(g["task_id"], reason="trained")
    return out
