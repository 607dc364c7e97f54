"""TRL's ``GRPOTrainer`` sampling through polar_mq harness sessions (its ``rollout_func`` hook).

    from polar_mq.client import Client
    from polar_mq.rl.trainers.trl import PolarRollout, polar_reward
    rollout = PolarRollout(Client(), template={...TaskRequest without instruction...},
                           instruction=lambda prompt: prompt)
    trainer = GRPOTrainer(model=..., reward_funcs=[polar_reward], rollout_func=rollout,
                          args=GRPOConfig(num_generations=G, ...), train_dataset=...)

TRL (1.x) calls ``rollout_func(prompts, trainer)`` with the process's prompt slice, each prompt
repeated ``num_generations`` times in a row, and expects per completion ``prompt_ids``,
``completion_ids`` and ``logprobs`` (the sampling engine's, for its importance-sampling
correction); extra keys go to the reward functions, except ``env_mask``, which TRL uses as the
loss mask of multi-turn completions. ``PolarRollout`` submits one task per distinct prompt with
``num_samples`` = num_generations (a GRPO group: the harness runs once per sample against the
gateway), takes the finished groups from the groups API, and returns, per session in order:
the session's trace ``prompt_ids``, its ``response_ids`` (sampled tokens and, with prefix_merging,
the tool results between turns), ``response_logprobs`` and ``loss_mask`` as ``env_mask``, and the
grader's reward as ``polar_reward`` (``None`` for an ERROR session: TRL ignores NaN rewards).

TRL takes exactly one completion per prompt slot, so a session must be one trace (prefix_merging
on a linear session). A session of several traces (per_request, a fork, a compaction, side calls)
cannot be fed to TRL whole: ``multi_trace="error"`` (the default) raises and names the session
rather than train on part of it silently; ``multi_trace="main"`` takes the trace labelled
``metadata.role == "main"`` and counts the others in ``dropped_traces``. Every trace of every
session is trained on by ``polar_mq.rl.trainers.samples`` (the project's own trainer in
examples/grpo). Guarded by tests/rl/test_grpo_loop.py::test_trl_rollout_refuses_part_of_a_session.

Weights: TRL trains the model in-process; the engine behind the gateway must get them after each
step (``sync_callback``: a ``TrainerCallback`` that saves the weights and calls your sync, e.g.
``examples/grpo/vllm_policy.sync``), and ``policy_version`` = the trainer's global step is set on
each task, so groups and records say which weights sampled them.

Tests: tests/rl/test_trl_rollout.py.
"""

from __future__ import annotations

import copy
import hashlib
import json
import time
from typing import Any, Callable

from polar_mq.client import Client


def _prompt_text(prompt: Any) -> str:
    """A conversational prompt's last user message, or a plain prompt string."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list):
        for msg in reversed(prompt):
            if isinstance(msg, dict) and msg.get("role") == "user":
                content = msg.get("content")
                if isinstance(content, str):
                    return content
                return "".join(p.get("text", "") for p in content or [] if isinstance(p, dict))
    raise ValueError(f"cannot take an instruction from prompt {prompt!r}")


class PolarRollout:
    """The ``rollout_func`` (see the module docstring)."""

    def __init__(self, client: Client, template: dict[str, Any], *,
                 instruction: Callable[[Any], str] = _prompt_text,
                 metadata: Callable[[Any], dict[str, Any]] | None = None,
                 policy_version: Callable[[Any], int | None] | None = None,
                 timeout: float = 600.0, lease: float = 600.0, eos_token_id: int | None = None,
                 multi_trace: str = "error"):
        if multi_trace not in ("error", "main"):
            raise ValueError(f"multi_trace must be 'error' or 'main', not {multi_trace!r}")
        self.multi_trace = multi_trace
        self.dropped_traces = 0
        self.client = client
        self.template = template
        self.instruction = instruction
        self.metadata = metadata
        self.policy_version = policy_version or (lambda trainer: int(trainer.state.global_step))
        self.timeout = timeout
        self.lease = lease
        self.eos_token_id = eos_token_id
        self.calls = 0
        self.last_groups: list[dict[str, Any]] = []

    def task_for(self, prompt: Any, samples: int, version: int | None) -> dict[str, Any]:
        body = copy.deepcopy(self.template)
        body["instruction"] = self.instruction(prompt)
        body["num_samples"] = samples
        meta = dict(body.get("metadata") or {})
        if self.metadata is not None:
            meta.update(self.metadata(prompt))
        if version is not None:
            meta["policy_version"] = version
        body["metadata"] = meta
        digest = hashlib.sha256(json.dumps([body, self.calls, time.time_ns()], sort_keys=True,
                                           default=str).encode()).hexdigest()[:16]
        body["task_id"] = f"trl-{digest}"
        return body

    def collect(self, task_ids: list[str]) -> dict[str, dict[str, Any]]:
        """The groups of ``task_ids`` (acked once taken); other groups are left leased to return."""
        want = set(task_ids)
        got: dict[str, dict[str, Any]] = {}
        deadline = time.monotonic() + self.timeout
        while want - set(got):
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"groups not finished after {self.timeout:.0f}s: {sorted(want - set(got))}")
            for g in self.client.next_groups(limit=len(want), wait=min(10.0, left), lease=self.lease):
                if g["task_id"] in want:
                    got[g["task_id"]] = g
                    self.client.ack_group(g["task_id"], reason="trained")
        return got

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, list]:
        g = int(trainer.num_generations if trainer.model.training else trainer.num_generations_eval)
        if len(prompts) % g:
            raise ValueError(f"{len(prompts)} prompts is not a multiple of num_generations={g}")
        unique = prompts[::g]
        version = self.policy_version(trainer)
        bodies = [self.task_for(p, g, version) for p in unique]
        self.calls += 1
        for body in bodies:
            self.client.submit(body)
        groups = self.collect([b["task_id"] for b in bodies])
        self.last_groups = [groups[b["task_id"]] for b in bodies]
        out: dict[str, list] = {"prompt_ids": [], "completion_ids": [], "logprobs": [], "env_mask": [],
                                "polar_reward": [], "polar_session_id": []}
        for body, group in zip(bodies, self.last_groups):
            trajs = sorted(group["trajectories"], key=lambda t: t["session_id"])
            if len(trajs) != g:
                raise RuntimeError(f"group {group['task_id']}: {len(trajs)} trajectories, expected {g}")
            for traj in trajs:
                self._append(out, traj)
        return out

    def _append(self, out: dict[str, list], traj: dict[str, Any]) -> None:
        traces = traj.get("traces") or []
        usable = traj.get("status") != "ERROR" and traj.get("reward") is not None and traces
        if usable:
            tr = self._the_trace(traj, traces)
            out["prompt_ids"].append(list(tr["prompt_ids"]))
            out["completion_ids"].append(list(tr["response_ids"]))
            out["logprobs"].append([float(x) for x in (tr.get("response_logprobs") or [0.0] * len(tr["response_ids"]))])
            out["env_mask"].append([int(m) for m in tr["loss_mask"]])
            out["polar_reward"].append(float(traj["reward"]))
        else:
            # nothing usable was sampled: one masked token, no reward (TRL skips NaN rewards)
            prompt = list(traces[0]["prompt_ids"]) if traces else [self.eos_token_id or 0]
            out["prompt_ids"].append(prompt)
            out["completion_ids"].append([self.eos_token_id or 0])
            out["logprobs"].append([0.0])
            out["env_mask"].append([0])
            out["polar_reward"].append(None)
        out["polar_session_id"].append(traj.get("session_id"))

    def _the_trace(self, traj: dict[str, Any], traces: list[dict[str, Any]]) -> dict[str, Any]:
        """The one trace TRL gets for this session (see the module docstring)."""
        if len(traces) == 1:
            return traces[0]
        if self.multi_trace == "main":
            main = _pick_main(traj, traces)
            self.dropped_traces += len(traces) - 1
            return main
        raise ValueError(
            f"session {traj.get('session_id')} has {len(traces)} traces; TRL takes one completion per sample, "
            "so only a one-trace session (builder prefix_merging, a linear session) can be trained whole "
            "(multi_trace='main' takes the main trace and drops the rest)")


def _role(trace: dict[str, Any]) -> Any:
    return (trace.get("metadata") or {}).get("role")


def _pick_main(traj: dict[str, Any], traces: list[dict[str, Any]]) -> dict[str, Any]:
    main = [t for t in traces if _role(t) == "main"]
    if len(main) != 1:
        raise ValueError(f"session {traj.get('session_id')}: {len(traces)} traces, {len(main)} labelled main")
    return main[0]


def polar_reward(completions: list[Any], polar_reward: list[float | None] | None = None, **_: Any) -> list[float | None]:
    """TRL reward function: the polar_mq grader's reward, passed through from the rollout."""
    if polar_reward is None:
        raise ValueError("polar_reward needs rollout_func=PolarRollout(...) (it supplies the rewards)")
    return list(polar_reward)


def sync_callback(save_and_sync: Callable[[Any, int], None]):
    """A ``transformers.TrainerCallback`` calling ``save_and_sync(model, global_step)`` after each
    optimiser step, so the engine behind the gateway samples the next batch with the new weights."""
    from transformers import TrainerCallback

    class PolarWeightSync(TrainerCallback):
        def on_step_end(self, args, state, control, model=None, **kwargs):  # noqa: ARG002
            if model is not None:
                save_and_sync(model, int(state.global_step))

    return PolarWeightSync()
