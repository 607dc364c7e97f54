"""Benchmark the trajectory builders: merge throughput, traces per session, payload sizes.

    .venv/bin/python bench/bench_merge.py [--turns 50] [--sessions 20] [--repeat 3]

1. Throughput on one long session (default 50 turns, ~100k tokens in the final sequence),
   rendered with the real stand-in tokenizer and chat template: tokens/s where tokens are all
   prompt + sampled ids the builder had to read (what the gateway recorded).
2. Traces per session on mixed sessions (side calls, sub-agents, retries, forks, truncation,
   drift, template changes), per_request vs prefix_merging on the same sessions.
3. Trajectory size as msgpack and as JSON for both builders.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

import msgpack

from polar_mq.merge import build
from polar_mq.merge.synthetic import SessionSim
from polar_mq.dev.model_server.tokenizer import load_tokenizer

BUILDERS = ("per_request", "prefix_merging")


def long_session(tok, turns: int, seed: int = 1):
    sim = SessionSim(tok, seed=seed, session_id="long")
    conv = sim.conversation()
    for _ in range(turns):
        sim.turn(conv, words=400, result_words=1050)
    return sim.records


def mixed_session(tok, seed: int, turns: int = 15):
    """A main conversation with the events real harnesses produce, at realistic rates."""
    sim = SessionSim(tok, seed=seed, session_id=f"mixed{seed}")
    rng = random.Random(seed)
    main = sim.conversation()
    title = sim.conversation(system="Write a five-word title.", tools=[],
                             user=main.messages[0]["content"])
    sim.turn(title, tool_call=False, advance=False)
    subs = []
    for _ in range(turns):
        roll = rng.random()
        if roll < 0.08:
            sim.turn(main, advance=False)  # client retry
        elif roll < 0.14:
            subs.append(sim.conversation(system="You are an explorer sub-agent."))
        elif roll < 0.18:
            branch = main.fork()
            branch.messages[-1] = {**branch.messages[-1], "content": sim.words(5)}
            sim.turn(branch)
        elif roll < 0.21:
            main.system = f"You are a coding agent. (request {rng.randint(0, 99)})"
        for sub in subs:
            if rng.random() < 0.5:
                sim.turn(sub, words=60, result_words=150)
        sim.turn(main, words=rng.randint(20, 120), result_words=rng.randint(50, 400),
                 truncate=rng.random() < 0.05, drift=rng.random() < 0.03)
    return sim.records


def timed_build(name, records, repeat):
    best, traj = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        traj = build(name, records, session_id="bench")
        best = min(best, time.perf_counter() - t0)
    return best, traj


def sizes(traj):
    """(msgpack, JSON, msgpack with float32 logprobs) bytes. msgpack writes Python floats as
    9-byte doubles, so float-heavy payloads can be larger than compact JSON."""
    data = traj.to_dict()
    return (len(msgpack.packb(data)), len(json.dumps(data, separators=(",", ":")).encode()),
            len(msgpack.packb(data, use_single_float=True)))


def render(rows, title):
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:  # plain text fallback
        print(f"\n{title}")
        for row in rows:
            print("  " + " | ".join(f"{c:>16}" for c in row))
        return
    table = Table(title=title)
    for i, head in enumerate(rows[0]):
        table.add_column(head, justify="left" if i == 0 else "right")
    for row in rows[1:]:
        table.add_row(*row)
    Console().print(table)


def ratio(a, b):
    return f"{a / b:.2f}x" if b else "-"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--turns", type=int, default=50)
    ap.add_argument("--sessions", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    tok = load_tokenizer()

    t0 = time.perf_counter()
    records = long_session(tok, args.turns)
    gen_s = time.perf_counter() - t0
    read_tokens = sum(len(r.prompt_token_ids) + len(r.completion_token_ids) for r in records)
    final = len(records[-1].prompt_token_ids) + len(records[-1].completion_token_ids)
    res = {name: timed_build(name, records, args.repeat) for name in BUILDERS}
    (pr_s, pr), (pm_s, pm) = res["per_request"], res["prefix_merging"]
    pr_size, pm_size = sizes(pr), sizes(pm)
    print(f"long session: {len(records)} calls, final sequence {final:,} tokens, "
          f"{read_tokens:,} recorded tokens (generated in {gen_s:.1f}s)")
    render([
        ["long session", "per_request", "prefix_merging", "pm / pr"],
        ["build time (ms)", f"{pr_s * 1e3:.1f}", f"{pm_s * 1e3:.1f}", ratio(pm_s, pr_s)],
        ["throughput (M tokens/s)", f"{read_tokens / pr_s / 1e6:.1f}",
         f"{read_tokens / pm_s / 1e6:.1f}", ratio(pr_s, pm_s)],
        ["traces", str(len(pr.traces)), str(len(pm.traces)), ratio(len(pm.traces), len(pr.traces))],
        ["trajectory tokens", f"{pr.stats['total_tokens']:,}", f"{pm.stats['total_tokens']:,}",
         ratio(pm.stats["total_tokens"], pr.stats["total_tokens"])],
        ["delivered_fraction", str(pr.stats["delivered_fraction"]),
         str(pm.stats["delivered_fraction"]), ""],
        ["msgpack bytes", f"{pr_size[0]:,}", f"{pm_size[0]:,}", ratio(pm_size[0], pr_size[0])],
        ["JSON bytes", f"{pr_size[1]:,}", f"{pm_size[1]:,}", ratio(pm_size[1], pr_size[1])],
        ["msgpack float32 bytes", f"{pr_size[2]:,}", f"{pm_size[2]:,}", ratio(pm_size[2], pr_size[2])],
        ["msgpack / JSON", ratio(pr_size[0], pr_size[1]), ratio(pm_size[0], pm_size[1]), ""],
        ["msgpack float32 / JSON", ratio(pr_size[2], pr_size[1]), ratio(pm_size[2], pm_size[1]), ""],
    ], f"{args.turns}-turn session")

    per = {name: [] for name in BUILDERS}
    size = {name: [0, 0, 0] for name in BUILDERS}
    kinds: dict[str, int] = {}
    roles: dict[str, int] = {}
    calls = []
    for seed in range(args.sessions):
        recs = mixed_session(tok, seed)
        calls.append(len(recs))
        for name in BUILDERS:
            traj = build(name, recs, session_id=f"m{seed}")
            assert traj.stats["delivered_fraction"] == 1.0
            per[name].append(len(traj.traces))
            for k, v in enumerate(sizes(traj)):
                size[name][k] += v
            if name == "prefix_merging":
                for k, v in traj.stats["break_kinds"].items():
                    kinds[k] = kinds.get(k, 0) + v
                for k, v in traj.stats["roles"].items():
                    roles[k] = roles.get(k, 0) + v
    mean = {n: statistics.mean(v) for n, v in per.items()}
    render([
        [f"{args.sessions} mixed sessions", "per_request", "prefix_merging", "pm / pr"],
        ["calls per session (mean)", f"{statistics.mean(calls):.1f}", "", ""],
        ["traces per session (mean)", f"{mean['per_request']:.1f}",
         f"{mean['prefix_merging']:.1f}", ratio(mean["prefix_merging"], mean["per_request"])],
        ["traces per session (max)", str(max(per["per_request"])),
         str(max(per["prefix_merging"])), ""],
        ["msgpack bytes (total)", f"{size['per_request'][0]:,}", f"{size['prefix_merging'][0]:,}",
         ratio(size["prefix_merging"][0], size["per_request"][0])],
        ["JSON bytes (total)", f"{size['per_request'][1]:,}", f"{size['prefix_merging'][1]:,}",
         ratio(size["prefix_merging"][1], size["per_request"][1])],
        ["msgpack float32 bytes (total)", f"{size['per_request'][2]:,}",
         f"{size['prefix_merging'][2]:,}", ratio(size["prefix_merging"][2], size["per_request"][2])],
    ], "traces per session")
    print(f"prefix_merging roles: {dict(sorted(roles.items()))}; "
          f"break kinds: {dict(sorted(kinds.items()))}")


if __name__ == "__main__":
    main()
