"""The GRPO example, end to end: real vLLM, polar_mq's pipeline, a CPU trainer, in-place weight sync.

    python -m examples.grpo.run [--harness codex|claude_code|shell] [--trainer polar|trl]
        [--builder prefix_merging|per_request] [--steps N] [--seed S] [--out DIR] [--turns K] ...

Each step:
1. rollout — this step's dataset rows (``task.rows``: new prompts each step; ``--turns K``: K
   instructions per row, one model call each) become tasks through ``polar_mq.rl.datasets`` (what
   ``polar-mq submit --dataset`` does) with ``num_samples`` = group size and
   ``metadata.policy_version`` = the weights now in vLLM; the harness (``--harness shell``: the
   openai-SDK agent ``agent.py``) runs against the gateway at temperature 1 (each reply: a direction
   word and the end of turn); the builder (``--builder``) turns each session into traces
   (prefix_merging: one per linear session, loss mask on the sampled tokens only; per_request: one
   per model call); the test_runner grader (``grader.py``) scores it; the finished groups come from
   ``Client.groups()`` (the groups API, lease + ack);
2. train — ``trainer.PolicyTrainer`` (``--trainer polar``): clipped-ratio policy gradient on the
   loss-mask-1 tokens of every trace with the recorded vLLM logprobs as behaviour policy and GRPO's
   group-relative advantages;
3. sync — the new weights go into the running vLLM in place (``vllm_policy.sync``): polar_mq
   pause, reload, resume with ``policy_version`` + 1, so the next groups carry it; then the
   groups are acked.

Writes ``metrics.jsonl``, ``metrics.md`` (the table) and ``reward.png`` into ``--out``; the last line
printed is CONTRACT's (Additions, turn 3)
``rl-demo: harness H, trainer T, builder B, mean reward A -> B over N steps (seed S)`` (A: first
step, B: mean of the last two steps).

Harnesses: ``shell`` (the openai-SDK agent) and ``codex`` (the pinned, unmodified Codex CLI with
``codex_task.OVERRIDES``; its base policy trained on Codex's captured prompt; the trainer ``CODEX_TRAINER``, SGD on the LM head; docs/rl.md, "Through the real Codex CLI"; guarded by
tests/vllm/test_grpo_vllm.py::test_codex_mean_reward_rises_over_grpo_steps) and ``claude_code`` (the
pinned, unmodified Claude Code CLI with ``claude_task.ARGS`` / ``ENV``: its own Bash tool over
Anthropic Messages; docs/rl.md, "Through the real Claude Code CLI"; its trainer ``CLAUDE_TRAINER``:
SGD on the LM head). Both take their base policy from ``harness_base.py``. ``--trainer trl``: TRL's GRPOTrainer on
the same rollouts and weight sync (``trl_loop.py``; with a CLI harness the LM head only).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from examples.grpo import task  # noqa: E402
from examples.grpo.report import sample_sessions  # noqa: E402
from examples.grpo.vllm_policy import PolicyServer, copy_weights, sync  # noqa: E402

AGENT = Path(__file__).resolve().with_name("agent.py")
CODEX_MAX_MODEL_LEN = 4096  # Codex's prompt is ~950 tokens, ~1.1k at its second call


def log(msg: str) -> None:
    print(f"[rl-demo] {msg}", file=sys.stderr, flush=True)


# The codex policy's trainer (docs/rl.md, "Through the real Codex CLI"): the LM head only (the whole
# model broke the tool-call format in one step), plain SGD. Every sample of a group carries the same
# ~25 tool-call tokens and the advantages sum to zero, so their rows' gradients nearly cancel; AdamW
# scaled that residual to a full lr-sized step per row (8 epochs: nats of logit at every position, and
# the tool call's JSON broke in ~1 run of 4), SGD moves a row in proportion to its gradient, so the
# format stays and the choice token, whose gradient does not cancel, learns (lr 3.0: the loss is a
# mean over the step's ~1k trained tokens, so one choice token's gradient is ~1e-3). Guarded by
# tests/rl/test_trainer_head.py and tests/vllm/test_grpo_vllm.py::test_codex_mean_reward_rises_over_grpo_steps.
CODEX_TRAINER = {"trainable": "lm_head", "optimizer": "sgd", "lr": 3.0, "epochs": 8}
# Claude Code's, the same recipe as measured on its prompt (docs/rl.md, "Through the real Claude Code
# CLI"): SGD at 2.0, only the LM-head rows of tokens sampled in the batch move.
CLAUDE_TRAINER = {"trainable": "lm_head", "optimizer": "sgd", "lr": 2.0, "epochs": 8, "head_rows": "sampled"}
CLI_TRAINERS = {"codex": CODEX_TRAINER, "claude_code": CLAUDE_TRAINER}
CLI_TRL_LR = 3e-3  # TRL keeps its AdamW: 1e-2 broke Codex's tool-call format within 1-4 steps (docs/rl.md, "Codex + TRL")
HARNESSES = ("codex", "claude_code", "shell")
TRAINERS = ("polar", "trl")
BUILDERS = ("prefix_merging", "per_request")


def template(timeout: int = 180, builder: str = "prefix_merging", harness: str = "shell",
             agent: Path = AGENT) -> dict:
    """The TaskRequest every dataset row is merged into. ``codex`` / ``claude_code``: the pinned CLI
    with its configuration reductions (``codex_task.OVERRIDES``, ``claude_task.ARGS`` / ``ENV``),
    sampling at temperature 1 (the CLIs send none), graded on the ``answer.txt`` its tool call wrote."""
    if harness in CLI_TRAINERS:
        from examples.grpo import claude_task, codex_task

        options: dict = {"extra_args": codex_task.extra_args()} if harness == "codex" else \
            {"extra_args": claude_task.extra_args(), "env": dict(claude_task.ENV)}
        return {
            "timeout_seconds": timeout,
            "agent": {"harness": harness, "model": "policy", "options": options,
                      "sampling": {"temperature": 1.0, "max_tokens": 64}},
            "runtime": {"backend": "local"},
            "builder": {"strategy": builder},
            "grader": {"strategy": "examples.grpo.grader:AnswerGrader", "config": {"timeout_seconds": 60}},
        }
    return {
        "timeout_seconds": timeout,
        "agent": {"harness": "shell", "model": "policy", "options": {"command": [sys.executable, str(agent)]}},
        "runtime": {"backend": "local"},
        "builder": {"strategy": builder},
        "grader": {"strategy": "examples.grpo.grader:CursorGrader", "config": {"timeout_seconds": 60}},
    }


def step_metrics(step: int, version: int, groups, batches, stats, timing, t_roll: float, t_train: float,
                 t_save: float, wall: float) -> dict:
    sessions = [s for g in groups for s in g.sessions]
    rewards = [t.reward for g in groups for t in g.trajectories if t.reward is not None and t.status != "ERROR"]
    trained = [s for b in batches for s in b.samples]
    passed = [t for g in groups for t in g.trajectories if t.reward is not None and t.reward >= 1.0]
    stale = [version - g.policy_version for g in groups if g.policy_version is not None]
    return {
        "step": step, "policy_version": version, "groups": len(groups), "sessions": len(sessions),
        "errors": sum(1 for s in sessions if s.state == "ERROR"),
        "mean_reward": round(sum(rewards) / len(rewards), 4) if rewards else 0.0,
        "pass_rate": round(len(passed) / len(sessions), 4) if sessions else 0.0,
        "groups_trained": sum(1 for b in batches if b.samples),
        "tokens_trained": stats.tokens_trained, "samples": stats.samples,
        # sequences the trainer updated on, and the tokens its forward passes went over (every epoch)
        "sequences": len(trained), "tokens_processed": stats.tokens_processed,
        "calls": sum(int((t.stats or {}).get("calls", 0)) for g in groups for t in g.trajectories),
        "staleness_mean": round(sum(stale) / len(stale), 3) if stale else None,
        "staleness_max": max(stale) if stale else None,
        "ratio_mean": round(stats.ratio_mean, 4), "ratio_max": round(stats.ratio_max, 4),
        "clip_fraction": round(stats.clip_fraction, 4), "behaviour_gap": round(stats.behaviour_gap, 6),
        "rollout_s": round(t_roll, 2), "train_s": round(t_train, 2), "save_s": round(t_save, 3),
        "sync_s": round(timing.pause_s + timing.load_s + timing.resume_s, 3),
        "sync_downtime_s": round(timing.downtime_s, 3), "wall_s": round(wall, 2),
        "viewer_sessions": sample_sessions(groups),  # metrics.md's viewer links (report.viewer_links)
    }


def polar_loop(args: argparse.Namespace, client, server, out: Path, wdir: Path, tmpl: dict, rows_for_step) -> list[dict]:
    """``--trainer polar``: rollout (groups API), trainer.PolicyTrainer, in-place sync, ack; per-step rows."""
    from polar_mq.rl.datasets import TaskOptions
    from polar_mq.rl.datasets import build_tasks
    from polar_mq.rl.datasets.readers import Row
    from polar_mq.rl.datasets.submit import submit_built
    from polar_mq.rl.trainers.samples import samples_from_group

    from examples.grpo.trainer import PolicyTrainer

    version = 0
    rows_out: list[dict] = []
    trainer = PolicyTrainer(wdir, lr=args.lr, clip_eps=args.clip, minibatches=args.minibatches, epochs=args.epochs,
                            seed=args.seed, optimizer=args.optimizer, kl_coef=args.kl_coef, trainable=args.trainable,
                            adam_eps=args.adam_eps, train_layers=args.train_layers, head_rows=args.head_rows)
    stream = client.groups(batch=args.prompts, wait=5.0, lease=600.0, max_staleness=args.max_staleness,
                           policy_version=lambda: version, drop_unusable=False)
    for step in range(args.steps):
        t0 = time.time()
        rows = [Row(i + 1, r) for i, r in enumerate(rows_for_step(step))]
        built = build_tasks(rows, tmpl, TaskOptions(samples=args.group_size, policy_version=version))
        bad = [b for b in built if b.task is None]
        if bad:
            raise SystemExit(f"dataset rows rejected: {[b.error for b in bad]}")
        outcomes = submit_built(client, built)
        errors = [o for o in outcomes if o.status == "error"]
        if errors:
            raise SystemExit(f"submit failed: {[o.error for o in errors]}")
        groups = stream.next_batch(args.prompts, timeout=args.step_timeout)
        if len(groups) < args.prompts:
            raise SystemExit(f"step {step}: {len(groups)} of {args.prompts} groups after {args.step_timeout}s")
        t1 = time.time()
        batches = [samples_from_group(g, advantage="mean_std") for g in groups]
        samples = [s for b in batches for s in b.samples]
        used = sum(1 for b in batches if b.samples)
        stats = trainer.step(samples, lr_scale=used / len(batches) if args.lr_by_groups else 1.0)
        t2 = time.time()
        new_dir = out / "weights" / f"v{version + 1}"
        t_save = trainer.save(new_dir)
        for name in ("tokenizer", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
                     "special_tokens_map.json"):
            src = wdir / name
            if src.is_dir():
                shutil.copytree(src, new_dir / name, dirs_exist_ok=True)
            elif src.exists():
                shutil.copy2(src, new_dir / name)
        timing = sync(server, client, new_dir, version + 1, method=args.sync)
        for g in groups:
            stream.ack(g, reason="trained")
        row = step_metrics(step, version, groups, batches, stats, timing, t1 - t0, t2 - t1, t_save,
                           time.time() - t0)
        rows_out.append(row)
        (out / "metrics.jsonl").open("a").write(json.dumps(row) + "\n")
        log(f"step {step}: v{version} mean reward {row['mean_reward']:.3f} pass {row['pass_rate']:.3f} "
            f"tokens {row['tokens_trained']} rollout {row['rollout_s']:.1f}s train {row['train_s']:.1f}s "
            f"sync {row['sync_s']:.2f}s (downtime {row['sync_downtime_s']:.2f}s) wall {row['wall_s']:.1f}s")
        old, wdir, version = wdir, new_dir, version + 1
        if old.name != "v0":
            shutil.rmtree(old, ignore_errors=True)
    return rows_out


def run(args: argparse.Namespace) -> dict:
    from polar_mq.client import Client
    from polar_mq.cli.embedded_redis import free_port
    from polar_mq.cli.up import launch

    from examples.grpo.base_model import build as build_base
    from examples.grpo.report import reopen_command, write_report

    on_cli = args.harness in CLI_TRAINERS  # a pinned real CLI: its trainer defaults, the one-instruction task
    if on_cli and args.turns != 1:
        raise SystemExit(f"harness {args.harness}: the one-instruction task only (docs/rl.md)")
    defaults: dict = CLI_TRAINERS.get(args.harness, {})
    if args.policy == "smollm2" and args.harness != "shell":
        raise SystemExit("policy smollm2: harness shell only (its chat template has no tool-call format; docs/rl.md)")
    # per-harness defaults: CLI_TRAINERS for the CLIs (docs/rl.md)
    if args.trainable is None:
        args.trainable = defaults.get("trainable", "all")
    if args.optimizer is None:  # the polar trainer's; TRL keeps its own AdamW
        args.optimizer = defaults.get("optimizer", "adamw")
    if args.lr is None:
        args.lr = (CLI_TRL_LR if args.trainer == "trl" else defaults["lr"]) if on_cli else 2e-3
    if args.kl_coef is None:
        args.kl_coef = 0.0
    if args.epochs is None:
        args.epochs = defaults.get("epochs", 4)
    args.lr_by_groups = args.lr_by_groups or on_cli
    if args.adam_eps is None:
        args.adam_eps = 1e-8
    if args.head_rows is None:
        args.head_rows = defaults.get("head_rows", "all")
    if args.trainer == "trl" and args.builder == "per_request" and (args.turns > 1 or on_cli):  # a CLI: 2 calls
        raise SystemExit("trainer trl takes one completion per sample: a multi-call session under per_request is "
                         "several traces (polar_mq/rl/trainers/trl.py); use --builder prefix_merging or --trainer polar")
    out = Path(args.out)
    if out.exists():
        shutil.rmtree(out)
    (out / "weights").mkdir(parents=True)
    if args.harness in CLI_TRAINERS:
        from examples.grpo import harness_base

        log(f"capturing {args.harness}'s prompt (the pinned CLI against a local recorder) …")
        base = harness_base.build(harness_base.recipe(args.harness), Path(f"{args.base}-{args.harness}"),
                                  seed=args.seed, log=log, target_p=args.target_p if args.target_p is not None else 0.3)
    elif args.policy == "smollm2":  # a real pretrained model (examples/grpo/smollm.py)
        from examples.grpo import smollm

        base = smollm.prepare(Path(args.base) if args.base != parser().get_default("base") else None)
    else:
        base_dir = Path(args.base) if args.turns == 1 else Path(f"{args.base}-turns{args.turns}")
        base = build_base(base_dir, seed=args.seed, log=log, turns=args.turns,
                          target_p=args.target_p if args.target_p is not None else (0.3 if args.turns == 1 else 0.6))
    version = 0
    wdir = out / "weights" / f"v{version}"
    copy_weights(base, wdir)
    if args.vllm_url:
        # a running vLLM (dev mode, same architecture): the base weights go in place, as every sync does
        server = PolicyServer.attach(args.vllm_url, wdir, out / "logs" / "vllm.log")
        t_start = server.load_base(wdir, version)
        log(f"attached to vLLM at {server.url}; base weights loaded in place in {t_start:.2f}s")
    else:
        server = PolicyServer(wdir, out / "logs" / "vllm.log", free_port(), threads=args.vllm_threads,
                              max_model_len=CODEX_MAX_MODEL_LEN if args.harness in CLI_TRAINERS else None)
        log(f"starting vLLM on {wdir} …")
        t_start = server.start()
        log(f"vLLM ready in {t_start:.0f}s at {server.url}")
    env = {"PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
           "POLAR_LOG_DIR": str(out / "logs"), "POLAR_SESSIONS_DIR": str(out / "sessions"),
           "POLAR_RESULTS_DIR": str(out / "results"), "POLAR_HOME": str(out / "home"),
           "OMP_NUM_THREADS": "1"}
    if args.harness in CLI_TRAINERS:
        # TITO: the CLI's second call goes upstream as the first call's ids + the sampled ids + the
        # rendered tool result, so prefix_merging gets one exact trace per session
        env["POLAR_TOKENIZER"] = str(base / "tokenizer")
    os.environ.update({k: v for k, v in env.items() if k in ("POLAR_HOME",)})
    stack = None
    rows_out: list[dict] = []
    try:
        os.environ["POLAR_LOG_DIR"] = str(out / "logs")
        # the embedded Redis keeps its data in OUT/home/redis, so the viewer links in metrics.md open
        # again after the run (report.reopen_command: `polar-mq up` on the same POLAR_HOME)
        stack = launch(api_port=free_port(), gateway_port=free_port(), upstreams=[server.url], flower=False,
                       concurrency=(args.init_workers, args.run_workers, args.postrun_workers), extra_env=env,
                       data_dir=out / "home" / "redis")
        client = Client(stack.api_url, timeout=60)
        client.resume(policy_version=version)
        tmpl = template(builder=args.builder, harness=args.harness,
                        agent=AGENT.with_name("smollm_agent.py") if args.policy == "smollm2" else AGENT)

        def rows_for_step(step: int) -> list[dict]:
            return task.rows(args.prompts, args.seed, offset=step * args.prompts, turns=args.turns)

        t_run = time.time()
        if args.trainer == "trl":
            from examples.grpo import trl_loop

            rows_out = trl_loop.train(args, client, server, out, wdir, tmpl, rows_for_step, log)
        else:
            rows_out = polar_loop(args, client, server, out, wdir, tmpl, rows_for_step)
        summary = write_report(out, rows_out, seed=args.seed, harness=args.harness, trainer=args.trainer,
                               builder=args.builder, turns=args.turns, total_s=time.time() - t_run,
                               vllm_start_s=t_start, vllm_weight_version=server.weight_version(),
                               api_url=stack.api_url, reopen=reopen_command(out, stack.api_url))
        return summary
    finally:
        if stack is not None:
            stack.stop()
        server.stop()


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    cache = Path(os.environ.get("POLAR_CACHE_DIR") or Path.home() / ".cache" / "polar_mq")
    ap.add_argument("--harness", choices=HARNESSES, default="codex",
                    help="the agent harness every session runs (CONTRACT's default: codex; see the module docstring)")
    ap.add_argument("--trainer", choices=TRAINERS, default="polar")
    ap.add_argument("--builder", choices=BUILDERS, default="prefix_merging",
                    help="how sessions become traces: one per linear session, or one per model call")
    ap.add_argument("--turns", type=int, default=1,
                    help="instructions (model calls) per session: > 1 is the multi-turn task the ablation runs")
    ap.add_argument("--target-p", type=float, default=None,
                    help="the base policy's p(correct direction) per call (default 0.3 for 1 turn, 0.6 for more)")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--prompts", type=int, default=4,
                    help="groups (tasks) per step; a multiple of 4 asks for every direction equally (task.rows)")
    ap.add_argument("--group-size", type=int, default=8, help="num_samples per task")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--lr", type=float, default=None,
                    help="default 2e-3 (shell, AdamW), 3.0 (codex, SGD), 2.0 (claude_code, SGD), "
                         "3e-3 (codex with --trainer trl, AdamW)")
    ap.add_argument("--clip", type=float, default=0.2)
    ap.add_argument("--optimizer", choices=["adamw", "sgd"], default=None,
                    help="default adamw (shell), sgd (codex, claude_code: CLI_TRAINERS; docs/rl.md)")
    ap.add_argument("--kl-coef", type=float, default=None,
                    help="GRPO's KL term to the starting policy (k3); default 0")
    ap.add_argument("--minibatches", type=int, default=1)
    ap.add_argument("--epochs", type=int, default=None,
                    help="passes over each step's batch (PPO epochs: the clip binds); default 4 (shell), 8 (codex)")
    ap.add_argument("--lr-by-groups", action="store_true",
                    help="scale each step's lr by the fraction of its groups whose rewards differ (always on for codex; the CI "
                         "test's setting: with 8 epochs, one informative group must not move the policy as "
                         "far as four; trainer.PolicyTrainer.step)")
    ap.add_argument("--trainable", choices=["all", "lm_head"], default=None,
                    help="parameters the polar trainer updates (default: lm_head for codex, all for shell; "
                         "docs/rl.md, 'Through the real Codex CLI')")
    ap.add_argument("--adam-eps", type=float, default=None,
                    help="AdamW's eps (default 1e-8; docs/rl.md: 1e-5 did not stop the codex collapse)")
    ap.add_argument("--head-rows", choices=["all", "sampled"], default=None,
                    help="LM-head rows the polar trainer may move: all, or only those of tokens sampled in the "
                         "batch (default: sampled for claude_code, all otherwise; docs/rl.md)")
    ap.add_argument("--max-staleness", type=int, default=0)
    ap.add_argument("--sync", choices=["reload", "restart"], default="reload")
    ap.add_argument("--out", default=str(cache / "grpo" / "run"))
    ap.add_argument("--base", default=str(cache / "grpo" / "base"))
    ap.add_argument("--policy", choices=["tiny", "smollm2"], default="tiny",
                    help="tiny: the project-built base policy (base_model.py); smollm2: SmolLM2-135M-Instruct "
                         "from the package registry (examples/grpo/smollm.py)")
    ap.add_argument("--train-layers", type=int, default=0,
                    help="train only the last N decoder layers + norm + LM head (0: the whole model)")
    ap.add_argument("--step-timeout", type=float, default=600.0)
    ap.add_argument("--init-workers", type=int, default=2)
    ap.add_argument("--run-workers", type=int, default=4)
    ap.add_argument("--postrun-workers", type=int, default=2)
    ap.add_argument("--vllm-threads", type=int, default=1)
    ap.add_argument("--vllm-url", default=None,
                    help="use this running vLLM (VLLM_SERVER_DEV_MODE=1, same model architecture) instead of "
                         "starting one; the base weights are reloaded into it in place, and it is left running")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    summary = run(args)
    print(summary["line"], flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
