"""``examples.grpo.run --trainer trl``: TRL's ``GRPOTrainer`` instead of the project's trainer, on the
same rollouts (polar_mq sessions through the groups API) and the same weight sync.

* sampling: ``polar_mq.rl.trainers.trl.PolarRollout`` is the ``rollout_func``: per batch it submits one
  task per distinct prompt with ``num_samples`` = ``num_generations``, takes the finished groups from
  the groups API and acks them, and hands TRL each session's trace ids, vLLM's logprobs and the loss
  mask (``env_mask``); the reward is the grader's (``polar_reward``);
* weights: after every optimiser step ``sync_callback`` saves the model and puts it into the running
  vLLM in place (``vllm_policy.sync``: pause, reload, resume with ``policy_version`` = TRL's global
  step), so the next batch is sampled by the updated weights (tests/vllm/test_grpo_vllm.py::
  test_trl_steps_reach_vllm checks the served logprobs change);
* one step = one generation batch (``prompts`` x ``group_size`` completions) and ``--epochs`` clipped
  optimiser passes over it (TRL's ``num_iterations``), then one sync;
* ``--harness codex``: each session is the real Codex CLI's two calls merged into one trace
  (TITO + prefix_merging), so TRL's completion is the tool call, Codex's tool output (``env_mask``
  0) and the final text; with ``--trainable lm_head`` (codex's default) only the LM head is trained.

Returns the per-step rows ``report.write_report`` takes (the same columns as the polar trainer's,
TRL's own loss/clip figures where it has them).
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Any, Callable

TOKENIZER_FILES = ("tokenizer", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
                   "special_tokens_map.json")


def copy_tokenizer(src: Path, dst: Path) -> None:
    for name in TOKENIZER_FILES:
        s = src / name
        if s.is_dir():
            shutil.copytree(s, dst / name, dirs_exist_ok=True)
        elif s.exists():
            shutil.copy2(s, dst / name)


def score_completions_only() -> bool:
    """TRL's fused LM head scores every position of prompt + completion on devices without Triton
    (CPU) and masks the prompt's afterwards (``trl.trainer.utils``: the fixed tile shapes matter for
    compilation on Neuron, not here); with Codex's ~1k-token prompt and ~40-token completions that
    is ~25x the work. Its compact path (gather the completion positions, score them, scatter back
    into zeros) gives the same log-probs and gradients; use it on CPU too. False when this TRL has
    no such switch (nothing changed). Guarded by
    tests/rl/test_grpo_loop.py::test_trl_scores_only_completion_positions_exactly."""
    import trl.trainer.utils as trl_utils

    if not callable(getattr(trl_utils, "_use_triton", None)):
        return False
    trl_utils._use_triton = lambda device: True  # only the compact-or-not choice in the fused forward
    return True


def scale_lr(trainer: Any, base_lr: float, scale: float) -> None:
    """``--lr-by-groups`` for TRL (the polar trainer's ``lr_scale``, on by default for codex): this
    batch's passes run at ``base_lr x scale`` x the schedule's factor (``scale``: the fraction of
    its groups whose rewards differ), so one informative group of four does not move the policy,
    over ``num_iterations`` AdamW steps, as far as four. Called from the rollout, i.e. before the
    batch's first optimiser step; the scheduler keeps the scaled base for the batch's later passes.
    Guarded by tests/rl/test_grpo_loop.py::test_trl_lr_by_groups_scales_the_batch_and_keeps_the_schedule."""
    sched = getattr(trainer.lr_scheduler, "scheduler", trainer.lr_scheduler)
    sched.base_lrs = [base_lr * scale for _ in sched.base_lrs]
    for group, factor in zip(trainer.optimizer.param_groups, sched.lr_lambdas):
        group["lr"] = base_lr * scale * factor(sched.last_epoch)


def cache_frozen_trunk(model: Any, keep: int = 4) -> dict:
    """With only the LM head trainable, the trunk's hidden states of a batch are the same on every
    pass TRL makes over it (its old-logprob pass and ``num_iterations`` training passes): compute
    them once per distinct ``(input_ids, attention_mask)`` and reuse them (the ``keep`` latest),
    so a Codex batch (32 x ~1.05k tokens) runs the trunk once instead of 9 times. Exact: no trunk
    parameter requires grad, so the cached tensors carry no graph, and the trunk is deterministic
    (no dropout); the trunk runs without a graph (a cached graph would be backpropagated twice,
    and TRL's Trainer may make the input embeddings require grad). Returns the counters ``{"computed", "reused"}``. Guarded by
    tests/rl/test_grpo_loop.py::test_trl_trunk_cache_is_exact."""
    import hashlib

    import torch

    trunk = model.model
    if any(p.requires_grad for p in trunk.parameters()):
        raise ValueError("cache_frozen_trunk: the trunk has trainable parameters (only an LM-head-only model may cache)")
    forward = trunk.forward
    cache: dict[tuple, Any] = {}
    stats = {"computed": 0, "reused": 0}

    def cached(input_ids: Any = None, attention_mask: Any = None, **kw: Any) -> Any:
        if input_ids is None or kw.get("inputs_embeds") is not None or kw.get("past_key_values") is not None:
            return forward(input_ids=input_ids, attention_mask=attention_mask, **kw)
        h = hashlib.sha256(input_ids.detach().cpu().numpy().tobytes())
        h.update(repr(tuple(input_ids.shape)).encode())
        if attention_mask is not None:
            h.update(attention_mask.detach().cpu().numpy().tobytes())
        key = (h.hexdigest(), tuple(sorted((k, repr(v)) for k, v in kw.items())))
        if key in cache:
            stats["reused"] += 1
            return cache[key]
        with torch.no_grad():  # nothing below the LM head trains: the hidden states need no graph
            out = forward(input_ids=input_ids, attention_mask=attention_mask, **kw)
        stats["computed"] += 1
        cache[key] = out
        while len(cache) > keep:
            cache.pop(next(iter(cache)))
        return out

    trunk.forward = cached
    return stats


def train(args: Any, client: Any, server: Any, out: Path, wdir: Path, template: dict, rows_for_step: Callable[[int], list],
          log: Callable[[str], None]) -> list[dict]:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast
    from trl import GRPOConfig, GRPOTrainer

    from examples.grpo.report import sample_sessions
    from examples.grpo.vllm_policy import sync
    from polar_mq.rl.trainers.trl import PolarRollout
    from polar_mq.rl.trainers.trl import polar_reward
    from polar_mq.rl.trainers.trl import sync_callback

    os.environ["TRL_EXPERIMENTAL_SILENCE"] = "1"
    score_completions_only()
    torch.manual_seed(args.seed)
    tok = PreTrainedTokenizerFast.from_pretrained(str(wdir / "tokenizer") if (wdir / "tokenizer").is_dir() else str(wdir))
    if tok.pad_token is None:
        tok.pad_token = "<|endoftext|>"
    model = AutoModelForCausalLM.from_pretrained(str(wdir), dtype=torch.float32)
    if getattr(args, "trainable", "all") == "lm_head":
        # the codex policy's setting (run.py's codex defaults, as trainer.PolicyTrainer does): only the
        # output layer moves, the hidden states that read Codex's ~1k-token prompt stay the base's;
        # the Trainer's optimiser takes the parameters that require grad only
        for name, p in model.named_parameters():
            p.requires_grad_(name.startswith("lm_head."))
        cache_frozen_trunk(model)
    # the dataset in TRL's order: step k's rows, each repeated by TRL's sampler num_generations times
    rows = [r for step in range(args.steps) for r in rows_for_step(step)]
    target = {r["instruction"]: r["metadata"]["target"] for r in rows}
    state: dict[str, Any] = {"version": 0, "t_step": time.time(), "rows": [], "pending": None}

    # Claude Code re-asks after a reply it shows as empty (a broken tool call): a side conversation,
    # a second trace of the session; TRL takes the main one (docs/rl.md, "Through the real Claude Code CLI")
    rollout = PolarRollout(client, template, metadata=lambda p: {"target": target[p]},
                           policy_version=lambda trainer: state["version"], timeout=args.step_timeout,
                           eos_token_id=tok.eos_token_id,
                           multi_trace="main" if getattr(args, "harness", "") == "claude_code" else "error")

    def sampled(prompts: list, trainer: Any) -> dict:
        t0 = time.time()
        result = rollout(prompts, trainer)
        groups = rollout.last_groups
        rewards = [r for r in result["polar_reward"] if r is not None]
        sessions = [s for g in groups for s in g.get("sessions") or []]
        used = [g for g in groups
                if len({t.get("reward") for t in g["trajectories"] if t.get("reward") is not None}) > 1]
        mask = result["env_mask"]
        lr_scale = len(used) / max(1, len(groups)) if getattr(args, "lr_by_groups", False) else 1.0
        if getattr(args, "lr_by_groups", False):
            scale_lr(trainer, args.lr, lr_scale)
        state["pending"] = {
            "step": len(state["rows"]), "policy_version": state["version"], "groups": len(groups),
            "sessions": len(sessions), "errors": sum(1 for s in sessions if s.get("state") == "ERROR"),
            "mean_reward": round(sum(rewards) / len(rewards), 4) if rewards else 0.0,
            "pass_rate": round(sum(1 for r in rewards if r >= 1.0) / max(1, len(sessions)), 4),
            "groups_trained": len(used),
            "sequences": sum(len(t.get("traces") or []) for g in used for t in g["trajectories"]),
            "tokens_trained": sum(sum(m) for m in mask),
            "tokens_processed": sum(len(p) + len(c) for p, c in zip(result["prompt_ids"], result["completion_ids"])),
            "calls": sum(int((t.get("stats") or {}).get("calls", 0)) for g in groups for t in g["trajectories"]),
            "staleness_max": max((state["version"] - g["policy_version"] for g in groups
                                  if isinstance(g.get("policy_version"), int)), default=None),
            "ratio_max": None, "rollout_s": round(time.time() - t0, 2),
            "viewer_sessions": sample_sessions(groups), "lr_scale": round(lr_scale, 3),
        }
        state["t_train"] = time.time()
        return result

    iters = max(1, int(args.epochs))  # TRL's num_iterations: clipped passes over each generation batch

    def save_and_sync(m: Any, global_step: int) -> None:
        if global_step % iters:
            return  # the batch's later passes reuse its samples; vLLM gets the weights once the batch is done
        step = global_step // iters
        t1 = time.time()
        new_dir = out / "weights" / f"v{step}"
        m.save_pretrained(new_dir, safe_serialization=True)
        copy_tokenizer(wdir, new_dir)
        t_save = time.time() - t1
        timing = sync(server, client, new_dir, step, method=args.sync)
        row = dict(state["pending"] or {})
        passes = [h for h in trainer.state.log_history if "clip_ratio/region_mean" in h][-iters:]
        row["clip_fraction"] = round(sum(float(h["clip_ratio/region_mean"]) for h in passes) / len(passes), 4) \
            if passes else None
        row.update({"train_s": round(t1 - state.get("t_train", t1), 2), "save_s": round(t_save, 3),
                    "sync_s": round(timing.pause_s + timing.load_s + timing.resume_s, 3),
                    "sync_downtime_s": round(timing.downtime_s, 3), "wall_s": round(time.time() - state["t_step"], 2)})
        state["rows"].append(row)
        (out / "metrics.jsonl").open("a").write(__import__("json").dumps(row) + "\n")
        log(f"step {row.get('step')}: v{row.get('policy_version')} mean reward {row.get('mean_reward', 0):.3f} "
            f"(trl) rollout {row.get('rollout_s')}s train {row['train_s']}s sync {row['sync_s']}s")
        state["version"], state["t_step"] = step, time.time()

    group = args.group_size
    cfg = GRPOConfig(output_dir=str(out / "trl"), num_generations=group, per_device_train_batch_size=args.prompts * group,
                     gradient_accumulation_steps=1, max_steps=args.steps * iters, learning_rate=args.lr, use_cpu=True,
                     report_to=[], logging_steps=1, save_strategy="no", max_completion_length=64, bf16=False,
                     seed=args.seed, dataloader_num_workers=0, beta=0.0, epsilon=args.clip, num_iterations=iters,
                     shuffle_dataset=False, temperature=1.0)
    trainer = GRPOTrainer(model=model, processing_class=tok, reward_funcs=[polar_reward], args=cfg,
                          train_dataset=Dataset.from_list([{"prompt": r["instruction"]} for r in rows]),
                          rollout_func=sampled, callbacks=[sync_callback(save_and_sync)])
    trainer.train()
    return state["rows"]
