"""The GRPO example's outputs: the per-step table (Markdown), the plot (PNG) and the summary line.

The plot is drawn with matplotlib's Agg backend (no display): mean reward and pass rate per step
on the left axis, tokens trained on the right, and the wall time per step split into rollout /
train / weight sync in a second panel.
"""

from __future__ import annotations

import json
from pathlib import Path

COLUMNS = [("step", "step"), ("policy_version", "version"), ("mean_reward", "mean reward"),
           ("pass_rate", "pass rate"), ("tokens_trained", "tokens trained"), ("groups_trained", "groups used"),
           ("staleness_max", "staleness"), ("ratio_max", "max ratio"), ("clip_fraction", "clipped"),
           ("rollout_s", "rollout s"), ("train_s", "train s"), ("sync_s", "sync s"),
           ("sync_downtime_s", "downtime s"), ("wall_s", "wall s")]


def summary_line(rows: list[dict], seed: int) -> tuple[float, float, str]:
    """A = the first step's mean reward, B = the mean of the last two steps' (one step is noisy)."""
    first = rows[0]["mean_reward"]
    tail = rows[-2:] if len(rows) >= 2 else rows
    last = sum(r["mean_reward"] for r in tail) / len(tail)
    return first, last, f"rl-demo: mean reward {first:.2f} -> {last:.2f} over {len(rows)} steps (seed {seed})"


def table(rows: list[dict]) -> str:
    head = "| " + " | ".join(h for _, h in COLUMNS) + " |"
    sep = "|" + "|".join("---:" for _ in COLUMNS) + "|"
    lines = [head, sep]
    for r in rows:
        cells = []
        for key, _ in COLUMNS:
            v = r.get(key)
            cells.append("" if v is None else (f"{v:.3f}" if isinstance(v, float) else str(v)))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(rows: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [r["step"] for r in rows]
    fig, (ax, ax_t) = plt.subplots(2, 1, figsize=(8, 7), sharex=True, gridspec_kw={"height_ratios": [3, 2]})
    ax.plot(steps, [r["mean_reward"] for r in rows], "o-", label="mean reward")
    ax.plot(steps, [r["pass_rate"] for r in rows], "s--", label="pass rate")
    ax.set_ylim(-0.02, 1.02)
    ax.set_ylabel("reward / pass rate")
    ax.grid(alpha=0.3)
    tok = ax.twinx()
    tok.bar(steps, [r["tokens_trained"] for r in rows], alpha=0.15, color="gray", label="tokens trained")
    tok.set_ylabel("tokens trained")
    lines, labels = ax.get_legend_handles_labels()
    l2, lb2 = tok.get_legend_handles_labels()
    ax.legend(lines + l2, labels + lb2, loc="upper left")
    ax.set_title(title)
    roll = [r["rollout_s"] for r in rows]
    train = [r["train_s"] + r.get("save_s", 0.0) for r in rows]
    syn = [r["sync_s"] for r in rows]
    ax_t.bar(steps, roll, label="rollout")
    ax_t.bar(steps, train, bottom=roll, label="train (+save)")
    ax_t.bar(steps, syn, bottom=[a + b for a, b in zip(roll, train)], label="weight sync")
    ax_t.set_ylabel("wall time per step (s)")
    ax_t.set_xlabel("step (policy version that sampled it)")
    ax_t.legend(loc="upper right")
    ax_t.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(out: Path, rows: list[dict], *, seed: int, **extra) -> dict:
    first, last, line = summary_line(rows, seed)
    md = table(rows)
    n = len(rows)
    avg = {k: round(sum(r[k] for r in rows) / n, 3) for k in ("rollout_s", "train_s", "sync_s", "sync_downtime_s", "wall_s")}
    summary = {"line": line, "first": first, "last": last, "steps": n, "seed": seed, "per_step_mean": avg, **extra}
    (out / "metrics.md").write_text(md + "\n\n" + json.dumps(summary, indent=2) + "\n")
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    plot(rows, out / "reward.png", line.replace("rl-demo: ", ""))
    print(md, flush=True)
    print(f"per step (mean): {avg}; files: {out / 'metrics.md'}, {out / 'reward.png'}", flush=True)
    return summary
