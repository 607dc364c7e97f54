"""The builder ablation: the same GRPO loop, tasks and seed with ``per_request`` (one trace per model
call) and with ``prefix_merging`` (one trace per linear session), side by side.

    python -m examples.grpo.ablation [--harness H] [--steps N] [--seed S] [--turns K] [--out DIR]

One vLLM serves both runs (each run puts the same base weights back in place first, as
``run.py --vllm-url`` does). ``--harness shell``: the multi-turn task (``--turns``, default 3: K
model calls per session, each call's prompt extending the one before), since with one call per
session the two builders give the same traces. ``--harness codex``: the one-instruction task
through the real Codex CLI, whose session is two model calls (the ``exec_command`` tool call, then
the final text after Codex's tool output): per_request trains on 2 sequences per session, each
repeating the ~1k-token prompt, prefix_merging on 1 (TITO makes the second call extend the first). Measured per run, from ``run.py``'s metrics: the sequences the
trainer updated on (the traces of every group whose rewards differ), the tokens its forward passes
went over (every PPO epoch), trainer seconds per step, step wall time and the mean reward per step.

Writes ``ablation.md`` (the table) and ``ablation.png`` into ``--out``, each run's own outputs in
``--out/<builder>``; the last line printed is CONTRACT's (Additions, turn 3):
``ablation: per_request U1 sequences T1 s; prefix_merging U2 sequences T2 s; X.XXx fewer sequences, Y.YYx faster trainer``
(U: sequences updated on over the run, T: trainer seconds over the run, X = U1/U2, Y = T1/T2).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from examples.grpo import run as grpo_run  # noqa: E402

BUILDERS = ("per_request", "prefix_merging")


def totals(rows: list[dict]) -> dict:
    n = len(rows)
    return {
        "sequences": sum(r["sequences"] for r in rows),
        "tokens_processed": sum(r["tokens_processed"] for r in rows),
        "tokens_trained": sum(r["tokens_trained"] for r in rows),
        "train_s": round(sum(r["train_s"] for r in rows), 2),
        "train_s_per_step": round(sum(r["train_s"] for r in rows) / n, 3),
        "wall_s_per_step": round(sum(r["wall_s"] for r in rows) / n, 2),
        "calls": sum(r.get("calls", 0) for r in rows),
        "sessions": sum(r["sessions"] for r in rows),
        "rewards": [r["mean_reward"] for r in rows],
    }


def summary_line(t: dict[str, dict]) -> str:
    a, b = t["per_request"], t["prefix_merging"]
    fewer = a["sequences"] / b["sequences"] if b["sequences"] else float("inf")
    faster = a["train_s"] / b["train_s"] if b["train_s"] else float("inf")
    return (f"ablation: per_request {a['sequences']} sequences {a['train_s']:.1f} s; "
            f"prefix_merging {b['sequences']} sequences {b['train_s']:.1f} s; "
            f"{fewer:.2f}x fewer sequences, {faster:.2f}x faster trainer")


def table(t: dict[str, dict]) -> str:
    head = ("| builder | sequences | tokens processed | tokens trained | trainer s/step | step wall s | "
            "model calls | sessions | mean reward per step |")
    lines = [head, "|" + "---|" * 9]
    for b in BUILDERS:
        x = t[b]
        lines.append(f"| {b} | {x['sequences']} | {x['tokens_processed']} | {x['tokens_trained']} | "
                     f"{x['train_s_per_step']:.3f} | {x['wall_s_per_step']:.2f} | {x['calls']} | {x['sessions']} | "
                     + " ".join(f"{r:.3f}" for r in x["rewards"]) + " |")
    return "\n".join(lines)


def plot(runs: dict[str, list[dict]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, ax_t) = plt.subplots(2, 1, figsize=(8, 7), sharex=True)
    width = 0.4
    for i, b in enumerate(BUILDERS):
        rows = runs[b]
        steps = [r["step"] for r in rows]
        ax.plot(steps, [r["mean_reward"] for r in rows], "o-", label=f"{b}: mean reward")
        ax_t.bar([s + (i - 0.5) * width for s in steps], [r["train_s"] for r in rows], width,
                 label=f"{b}: trainer s ({sum(r['sequences'] for r in rows)} sequences)")
    ax.set_ylim(-0.02, 1.02)
    ax.set_ylabel("mean reward")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left")
    ax.set_title(title, fontsize=9)
    ax_t.set_ylabel("trainer seconds per step")
    ax_t.set_xlabel("step")
    ax_t.grid(alpha=0.3)
    ax_t.legend(loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run(args: argparse.Namespace) -> dict:
    from examples.grpo.base_model import build as build_base
    from examples.grpo.vllm_policy import PolicyServer, copy_weights
    from polar_mq.cli.embedded_redis import free_port

    codex = args.harness == "codex"
    if args.turns is None:
        args.turns = 1 if codex else 3  # Codex's session is two calls already (tool call, final text)
    if codex and args.turns != 1:
        raise SystemExit("ablation: harness codex runs the one-instruction task (--turns 1; docs/rl.md)")
    out = Path(args.out)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    common = ["--harness", args.harness, "--steps", str(args.steps), "--seed", str(args.seed),
              "--turns", str(args.turns), "--prompts", str(args.prompts), "--group-size", str(args.group_size),
              "--base", args.base, *args.run_args]
    server = None
    url = args.vllm_url
    if url is None:
        # one vLLM for both runs: started on the base policy, which each run reloads in place first
        probe = grpo_run.parser().parse_args(common)
        if codex:  # the base run.py builds for codex (cached by its stamp), and Codex's longer window
            from examples.grpo import harness_base

            base = harness_base.build(harness_base.recipe("codex"), Path(f"{probe.base}-codex"), seed=args.seed,
                                      log=grpo_run.log, target_p=probe.target_p if probe.target_p is not None else 0.3)
        else:
            base_dir = Path(probe.base) if probe.turns == 1 else Path(f"{probe.base}-turns{probe.turns}")
            target_p = probe.target_p if probe.target_p is not None else (0.3 if probe.turns == 1 else 0.6)
            base = build_base(base_dir, seed=args.seed, log=grpo_run.log, turns=probe.turns, target_p=target_p)
        wdir = out / "vllm-base"
        copy_weights(base, wdir)
        server = PolicyServer(wdir, out / "logs" / "vllm.log", free_port(), threads=args.vllm_threads,
                              max_model_len=grpo_run.CODEX_MAX_MODEL_LEN if codex else None)
        grpo_run.log(f"ablation: starting vLLM on {wdir} …")
        grpo_run.log(f"ablation: vLLM ready in {server.start():.0f}s at {server.url}")
        url = server.url
    runs: dict[str, list[dict]] = {}
    try:
        for b in BUILDERS:
            grpo_run.log(f"ablation: builder {b}")
            summary = grpo_run.run(grpo_run.parser().parse_args(
                [*common, "--builder", b, "--out", str(out / b), "--vllm-url", url]))
            grpo_run.log(f"ablation: {summary['line']}")
            runs[b] = [json.loads(line) for line in (out / b / "metrics.jsonl").read_text().splitlines()]
    finally:
        if server is not None:
            server.stop()
    t = {b: totals(rows) for b, rows in runs.items()}
    line = summary_line(t)
    calls = t["prefix_merging"]["calls"] / max(1, t["prefix_merging"]["sessions"])
    md = (f"# Builder ablation: harness {args.harness}, {args.turns} instruction(s) per session "
          f"({calls:.2f} model calls per session), "
          f"{args.prompts} prompts x {args.group_size} samples per step, {args.steps} steps, seed {args.seed}\n\n"
          + table(t) + "\n\nsequences / tokens: summed over the run; tokens processed: prompt + response tokens "
          "of every trainer forward pass (all PPO epochs).\n\n" + line + "\n")
    (out / "ablation.md").write_text(md)
    (out / "ablation.json").write_text(json.dumps({"totals": t, "line": line}, indent=2))
    plot(runs, out / "ablation.png", line.replace("ablation: ", ""))
    print(table(t), flush=True)
    print(f"files: {out / 'ablation.md'}, {out / 'ablation.png'}", flush=True)
    return {"line": line, "totals": t, "runs": runs}


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    cache = Path(os.environ.get("POLAR_CACHE_DIR") or Path.home() / ".cache" / "polar_mq")
    ap.add_argument("--harness", choices=grpo_run.HARNESSES, default="shell",
                    help="the harness of both runs: shell (the multi-turn task) or codex (the real Codex CLI)")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--turns", type=int, default=None,
                    help="instructions (model calls) per session: default 3 for shell, 1 for codex")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--out", default=str(cache / "grpo" / "ablation"))
    ap.add_argument("--base", default=str(cache / "grpo" / "base"))
    ap.add_argument("--vllm-url", default=None, help="a running vLLM (VLLM_SERVER_DEV_MODE=1) to use for both runs")
    ap.add_argument("--vllm-threads", type=int, default=1)
    ap.add_argument("run_args", nargs="*", help="more examples.grpo.run options for both runs (after --)")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    result = run(args)
    print(result["line"], flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
