"""A batch of polar_mq groups -> the fields of a verl ``DataProto``.

verl's PPO/GRPO trainer consumes a ``DataProto`` whose ``batch`` (a TensorDict) and
``non_tensor_batch`` (numpy object arrays) carry, per sample (one per trace of each usable
trajectory):

=========================  ====================================================================
field                       from polar_mq
=========================  ====================================================================
``prompts``        [B, P]   ``prompt_ids``, LEFT-padded with ``pad_id`` to the longest prompt
``responses``      [B, R]   ``response_ids``, right-padded
``input_ids``      [B, P+R] ``prompts`` ‖ ``responses``
``attention_mask`` [B, P+R] 1 on real tokens (both sides), 0 on padding
``position_ids``   [B, P+R] cumulative sum of the attention mask − 1, clipped at 0
``response_mask``  [B, R]   the trace's ``loss_mask`` (0 on tool results and padding): verl's
                            multi-turn loss mask
``rollout_log_probs`` [B,R] ``response_logprobs`` (0.0 on masked / padded positions)
``token_level_scores`` [B,R] the trajectory's reward on the last response token whose
                            ``response_mask`` is 1 (verl's outcome-reward convention), else 0
``uid``  (non-tensor)       the group's ``task_id``: verl's GRPO advantage groups by ``uid``
``polar_session_id``, ``policy_version`` (non-tensor)  provenance
=========================  ====================================================================

verl's custom rollout entry point for agents is an ``AgentLoopBase`` subclass whose ``run``
returns an ``AgentLoopOutput(prompt_ids, response_ids, response_mask, response_logprobs,
num_turns, metrics, reward_score)``; ``agent_loop_outputs`` gives exactly those fields per
sample. Run here: the field mapping on real trajectories (numpy arrays; tests/
test_trainer_mappings.py). NOT run: verl itself (Ray + FSDP/Megatron on GPUs); ``to_data_proto``
builds the real ``DataProto`` only when verl and torch are installed.
"""

from __future__ import annotations

from typing import Any, Iterable

from polar_mq.model import Group
from polar_mq.rl.trainers.samples import TrainSample
from polar_mq.rl.trainers.samples import samples_from_group


def _samples(groups: Iterable[Group | dict[str, Any]], advantage: str) -> list[TrainSample]:
    return [s for g in groups for s in samples_from_group(g, advantage=advantage, drop_constant=False).samples]


def batch_fields(groups: Iterable[Group | dict[str, Any]], *, pad_id: int = 0, advantage: str = "mean_std"):
    """(tensors as numpy int64/float32 arrays, non-tensor numpy object arrays)."""
    import numpy as np

    samples = _samples(groups, advantage)
    if not samples:
        raise ValueError("no usable trajectories in these groups")
    n = len(samples)
    p = max(len(s.prompt_ids) for s in samples)
    r = max(len(s.response_ids) for s in samples)
    prompts = np.full((n, p), pad_id, dtype=np.int64)
    responses = np.full((n, r), pad_id, dtype=np.int64)
    attn = np.zeros((n, p + r), dtype=np.int64)
    resp_mask = np.zeros((n, r), dtype=np.int64)
    logps = np.zeros((n, r), dtype=np.float32)
    scores = np.zeros((n, r), dtype=np.float32)
    for i, s in enumerate(samples):
        lp, lr = len(s.prompt_ids), len(s.response_ids)
        prompts[i, p - lp:] = s.prompt_ids
        responses[i, :lr] = s.response_ids
        attn[i, p - lp:p] = 1
        attn[i, p:p + lr] = 1
        resp_mask[i, :lr] = s.loss_mask
        logps[i, :lr] = [x if m else 0.0 for x, m in zip(s.behaviour_logprobs, s.loss_mask)]
        trained = [j for j, m in enumerate(s.loss_mask) if m]
        if trained:
            scores[i, trained[-1]] = s.reward
    position_ids = np.clip(np.cumsum(attn, axis=1) - 1, 0, None)
    tensors = {"prompts": prompts, "responses": responses, "input_ids": np.concatenate([prompts, responses], 1),
               "attention_mask": attn, "position_ids": position_ids, "response_mask": resp_mask,
               "rollout_log_probs": logps, "token_level_scores": scores}
    non_tensors = {"uid": np.array([s.group_id for s in samples], dtype=object),
                   "polar_session_id": np.array([s.session_id for s in samples], dtype=object),
                   "policy_version": np.array([s.policy_version for s in samples], dtype=object)}
    return tensors, non_tensors


def to_data_proto(groups: Iterable[Group | dict[str, Any]], **kwargs: Any):
    """A real ``verl.DataProto`` (needs verl + torch)."""
    import torch
    from verl import DataProto  # type: ignore[import-not-found]

    tensors, non_tensors = batch_fields(groups, **kwargs)
    return DataProto.from_dict(tensors={k: torch.from_numpy(v) for k, v in tensors.items()},
                               non_tensors=non_tensors)


def agent_loop_outputs(group: Group | dict[str, Any], *, advantage: str = "mean_std") -> list[dict[str, Any]]:
    """The ``AgentLoopOutput`` fields of each usable trace (unpadded, one dict per sample)."""
    out = []
    for s in _samples([group], advantage):
        out.append({"prompt_ids": list(s.prompt_ids), "response_ids": list(s.response_ids),
                    "response_mask": list(s.loss_mask), "response_logprobs": list(s.behaviour_logprobs),
                    "num_turns": int(s.metadata.get("calls", 0)) or None, "reward_score": s.reward,
                    "metrics": {"polar_session_id": s.session_id, "policy_version": s.policy_version}})
    return out
