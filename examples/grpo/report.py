"""The GRPO example's outputs: the per-step table (Markdown), the plot (PNG) and the summary line.

The plot is drawn with matplotlib's Agg backend (no display): mean reward and pass rate per step
on the left axis, tokens trained on the right, and the wall time per step split into rollout /
train / weight sync in a second panel.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

COLUMNS = [("step", "step"), ("policy_version", "version"), ("mean_reward", "mean reward"),
           ("pass_rate", "pass rate"), ("tokens_trained", "tokens trained"), ("groups_trained", "groups used"),
           ("staleness_max", "staleness"), ("ratio_max", "max ratio"), ("clip_fraction", "clipped"),
           ("rollout_s", "rollout s"), ("train_s", "train s"), ("sync_s", "sync s"),
           ("sync_downtime_s", "downtime s"), ("wall_s", "wall s")]


def summary_line(rows: list[dict], seed: int, *, harness: str = "shell", trainer: str = "polar",
                 builder: str = "prefix_merging") -> tuple[float, float, str]:
    """A = the first step's mean reward, B = the mean of the last two steps' (one step is noisy).
    The line is CONTRACT's (Additions, turn 3; checked by tests/vllm/test_grpo_vllm.py::check_loop)."""
    first = rows[0]["mean_reward"]
    tail = rows[-2:] if len(rows) >= 2 else rows
    last = sum(r["mean_reward"] for r in tail) / len(tail)
    return first, last, (f"rl-demo: harness {harness}, trainer {trainer}, builder {builder}, "
                         f"mean reward {first:.2f} -> {last:.2f} over {len(rows)} steps (seed {seed})")


def rise_beyond_noise(rewards: list[float], n: int, floor: float = 0.2) -> dict:
    """The reward-rising criterion of the test and of ``sim.py --seeds``: B - A (A the first step's
    mean reward, B the mean of the last two steps', as in the summary line) must exceed two binomial
    standard errors of that difference (pooled p; ``n`` sessions per step, so A has n, B 2n) and
    ``floor``. A one-sided z-test at z = 2 (~2.3% false-positive rate with no learning at all)."""
    import math

    first = rewards[0]
    tail = rewards[-2:] if len(rewards) >= 2 else rewards
    last = sum(tail) / len(tail)
    p = (first + last) / 2
    noise = 2 * math.sqrt(p * (1 - p) * (1 / n + 1 / (len(tail) * n)))
    return {"first": first, "last": last, "rise": last - first, "noise": noise,
            "passed": last - first > max(noise, floor)}


def trend_beyond_noise(rewards: list[float], n: int, floor: float = 0.2, z: float = 2.0) -> dict:
    """The reward-rising criterion of the CI test (``tests/vllm/test_grpo_vllm.py``) and of
    ``sim.py --seeds``: the least-squares slope of the per-step mean reward over all steps must
    exceed two binomial standard errors (each step's mean is over ``n`` sessions; p is the run's
    mean reward: a one-sided z-test at z = 2, ~2.3% false-positive rate with no learning at all),
    and the fitted rise over the run (slope x (steps - 1)) must be at least ``floor``. Uses every
    step, so it separates a rise from noise with fewer sessions than first-vs-last."""
    import math

    m = len(rewards)
    if m < 2:
        raise ValueError("a trend needs at least two steps")
    k_mean = (m - 1) / 2
    sxx = sum((k - k_mean) ** 2 for k in range(m))
    r_mean = sum(rewards) / m
    slope = sum((k - k_mean) * (r - r_mean) for k, r in enumerate(rewards)) / sxx
    se = math.sqrt(max(r_mean * (1 - r_mean), 1e-9) / n / sxx)
    return {"slope": slope, "se": se, "z": slope / se, "fitted_rise": slope * (m - 1),
            "passed": slope > z * se and slope * (m - 1) >= floor}


def gain_beyond_noise(rewards: list[float], n: int, floor: float = 0.2, z: float = 2.3) -> dict:
    """The mean reward of every step after the first against the first (the policy before any
    update): the gain must exceed ``z`` binomial standard errors of that difference (pooled p; n
    sessions per step, so the first has n and the rest (m - 1) n) and ``floor``. Uses every
    session, like the slope, but a fast rise that then levels off (or dips a little) passes here
    where a slope over all steps may not: 0.31 -> 0.69 0.72 0.47 0.69 had z 1.9 on the slope and
    3.4 here (a real CI run)."""
    import math

    m = len(rewards)
    if m < 2:
        raise ValueError("a gain needs at least two steps")
    first, rest = rewards[0], sum(rewards[1:]) / (m - 1)
    p = sum(rewards) / m
    se = math.sqrt(max(p * (1 - p), 1e-9) * (1 / n + 1 / ((m - 1) * n)))
    gain = rest - first
    return {"first": first, "rest": rest, "gain": gain, "se": se, "z": gain / se,
            "passed": gain > z * se and gain >= floor}


def learnt(rewards: list[float], n: int, z: float = 2.3) -> dict:
    """The CI test's criterion: the slope over all steps (``trend_beyond_noise``) or the gain of the
    later steps over the first (``gain_beyond_noise``), each at ``z`` = 2.3 standard errors, so that
    with nothing learnt the two together pass at most ~2.2% of runs (each one-sided ~1.1%)."""
    trend = trend_beyond_noise(rewards, n, z=z)
    gain = gain_beyond_noise(rewards, n, z=z)
    return {"trend": trend, "gain": gain, "passed": trend["passed"] or gain["passed"]}


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
    ax.set_title(textwrap.fill(title, 80), fontsize=10)  # the summary line: wrapped, or it runs off the figure
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


def _get(obj, key: str):
    return obj.get(key) if isinstance(obj, dict) else getattr(obj, key, None)


def sample_sessions(groups) -> dict:
    """One step's sessions to look at in the viewer: ``{"success": id, "failure": id}``, the first
    session id (sorted) graded reward 1 and the first graded 0 (never an ERROR session; ``None``
    when the step had none). ``groups``: ``polar_mq.model.Group``s or the groups API's dicts.
    Guarded by tests/rl/test_grpo_loop.py::test_viewer_links_pick_a_success_and_a_failure."""
    graded = sorted((str(_get(t, "session_id")), float(_get(t, "reward")))
                    for g in groups for t in (_get(g, "trajectories") or [])
                    if _get(t, "reward") is not None and _get(t, "status") != "ERROR" and _get(t, "session_id"))
    return {"success": next((s for s, r in graded if r >= 1.0), None),
            "failure": next((s for s, r in graded if r == 0.0), None)}


def viewer_links(rows: list[dict], api_url: str | None) -> dict:
    """``{"success": {...}, "failure": {...}}`` (each ``None`` when no step had one): the session
    from the LAST step that has one (``rows[i]["viewer_sessions"]``, :func:`sample_sessions`),
    with its step, policy version and viewer page ``<api_url>/ui/sessions/<id>`` (no token in
    the address: the viewer signs a browser in with ``?token=``, docs/viewer.md)."""
    picked: dict = {}
    for kind in ("success", "failure"):
        picked[kind] = None
        for row in reversed(rows):
            sid = (row.get("viewer_sessions") or {}).get(kind)
            if sid:
                picked[kind] = {"session_id": sid, "step": row.get("step"), "policy_version": row.get("policy_version"),
                                "reward": 1.0 if kind == "success" else 0.0,
                                "url": f"{api_url.rstrip('/')}/ui/sessions/{sid}" if api_url else None}
                break
    return picked


def reopen_command(out: Path, api_url: str) -> str:
    """How to serve a finished run's sessions again: ``polar-mq up`` on the run's POLAR_HOME
    (its Redis data, in ``OUT/home/redis``, and its token) and the API port of the links."""
    from urllib.parse import urlsplit

    home = Path(out).resolve() / "home"
    port = urlsplit(api_url).port
    return (f"The links are served while the run's stack is up. Afterwards: "
            f"`POLAR_HOME={home} polar-mq up --api-port {port} --no-flower` serves them again (the run's "
            f"Redis data is in `{home / 'redis'}`), and `?token=$(cat {home / 'token'})` on a link signs "
            f"a browser in.")


def viewer_section(links: dict, reopen: str | None = None) -> str:
    """metrics.md's viewer section: one successful and one failed sample's viewer page."""
    lines = ["## Sessions in the viewer", ""]
    for kind, label in (("success", "successful sample (reward 1)"), ("failure", "failed sample (reward 0)")):
        x = links.get(kind)
        if x is None:
            lines.append(f"- {label}: none in this run")
        else:
            lines.append(f"- {label}, step {x['step']} (policy v{x['policy_version']}): {x['url'] or x['session_id']}"
                         f" (session `{x['session_id']}`)")
    if reopen:
        lines += ["", reopen]
    return "\n".join(lines)


def write_report(out: Path, rows: list[dict], *, seed: int, harness: str = "shell", trainer: str = "polar",
                 builder: str = "prefix_merging", api_url: str | None = None, reopen: str | None = None,
                 **extra) -> dict:
    first, last, line = summary_line(rows, seed, harness=harness, trainer=trainer, builder=builder)
    md = table(rows)
    links = viewer_links(rows, api_url)
    n = len(rows)
    avg = {k: round(sum(r[k] for r in rows) / n, 3) for k in ("rollout_s", "train_s", "sync_s", "sync_downtime_s", "wall_s")}
    summary = {"line": line, "first": first, "last": last, "steps": n, "seed": seed, "harness": harness,
               "trainer": trainer, "builder": builder, "per_step_mean": avg, "viewer": links, **extra}
    (out / "metrics.md").write_text(md + "\n\n" + viewer_section(links, reopen) + "\n\n"
                                    + json.dumps(summary, indent=2) + "\n")
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    (out / "viewer.json").write_text(json.dumps(links, indent=2))
    plot(rows, out / "reward.png", line.replace("rl-demo: ", ""))
    print(md, flush=True)
    for kind in ("success", "failure"):
        if links[kind] is not None:
            print(f"viewer, {kind}: {links[kind]['url'] or links[kind]['session_id']}", flush=True)
    print(f"per step (mean): {avg}; files: {out / 'metrics.md'}, {out / 'reward.png'}", flush=True)
    return summary
