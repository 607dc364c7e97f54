"""Per harness: the share of calls in chains with a known origin, lineage detection off vs on.

    PYTHONPATH=. .venv/bin/python bench/bench_lineage.py [--json OUT.json] [HARNESS ...]

Input: the real CLIs' recorded traffic in tests/replays/lineage/<harness>/<scenario>.json
(scripts/record_lineage.py: each CLI using its sub-agent tool, and compacting on a small window).
Each fixture is replayed into a fresh gateway session in front of the stand-in run with the
fixture's own script (the same answers token for token), and the session's trajectory is built
by the `prefix_merging` builder. Per harness (its sessions summed):

- calls, chains (traces);
- *before*: the share of calls in the root chain only: the chain the task's prompt started (the
  earliest `root` trace of the main conversation). Without lineage that is the only chain whose
  origin a trainer knows; a sub-agent's or a post-compaction conversation is just another root;
- *before + retry/fork/edit links*: also the chains the call forest already linked to their
  parent (`parent_trace`) before lineage: retries, forks, re-tokenised continuations;
- *after*: the share of calls in chains with a known origin (docs/lineage.md, "Known origin"):
  the root chain, plus every chain whose `origin` links it to another trace: `sub_agent`
  (`spawned_by`), `compaction` (`continues_from`), `summary` (`compaction_summary`), `retry`,
  `fork`, `edit` (`parent_trace` / `continues_trace`);
- the origins found (stats.origins summed).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from polar_mq.merge.origins import ORIGINS  # noqa: E402
from tests.support import lineage_replay  # noqa: E402
from tests.support.servers import AUTH, start_gateway, start_model_server, stop  # noqa: E402

LINKED = frozenset(ORIGINS) - {"root"}
FOREST = frozenset({"retry", "fork", "edit"})  # linked by the call forest (parent_trace) before lineage


def root_trace(traces: list[dict[str, Any]]) -> int | None:
    """The chain the task's prompt started: the earliest root trace of the main conversation
    (else the earliest root trace)."""
    roots = [(t["metadata"].get("conversation_role") != "main", t["metadata"].get("started_at") or 0, i)
             for i, t in enumerate(traces) if t["metadata"].get("origin", "root") == "root"]
    return min(roots)[2] if roots else None


def known_calls(traj: dict[str, Any]) -> tuple[int, int, int, int]:
    """(calls, calls in the root chain, in the root chain or a chain the call forest links
    (retry/fork/edit), in chains with a known origin)."""
    traces = traj["traces"]
    root = root_trace(traces)
    total = sum(len(t["call_ids"]) for t in traces)
    before = len(traces[root]["call_ids"]) if root is not None else 0

    def linked(origins: frozenset[str]) -> int:
        return sum(len(t["call_ids"]) for i, t in enumerate(traces)
                   if i != root and t["metadata"].get("origin") in origins)
    return total, before, before + linked(FOREST), before + linked(LINKED)


def measure(path: Path, log_dir: Path, redis_url: str) -> dict[str, Any]:
    fixture = lineage_replay.load(path)
    script = lineage_replay.write_script(fixture, log_dir / f"{path.parent.name}-{path.stem}.json")
    ms = start_model_server(log_dir, "--scripted", str(script), "--max-model-len",
                            str(fixture["stand_in"]["max_model_len"]), name=f"ms-{path.parent.name}")
    gw = start_gateway(log_dir, redis_url, [ms.url], name=f"gw-{path.parent.name}")
    try:
        sid = lineage_replay.replay(gw.url, fixture, AUTH, f"{path.parent.name}/{path.stem}")
        traj = lineage_replay.trajectory(gw.url, sid, AUTH)
    finally:
        stop(gw.proc)
        stop(ms.proc)
    calls, before, forest, after = known_calls(traj)
    return {"harness": fixture["harness"], "scenario": fixture["scenario"], "calls": calls,
            "chains": len(traj["traces"]), "before": before, "forest": forest, "after": after,
            "origins": {k: v for k, v in traj["stats"]["origins"].items() if v},
            "subagents": traj["stats"]["subagents"], "compactions": traj["stats"]["compactions"]}


def table(rows: list[dict[str, Any]]) -> str:
    by: dict[str, dict[str, Any]] = {}
    for r in rows:
        agg = by.setdefault(r["harness"], {"sessions": [], "calls": 0, "chains": 0, "before": 0, "forest": 0,
                                           "after": 0, "origins": Counter()})
        agg["sessions"].append(r["scenario"])
        for k in ("calls", "chains", "before", "forest", "after"):
            agg[k] += r[k]
        agg["origins"].update(r["origins"])
    lines = ["| harness | sessions | calls | chains | known origin before (root chain) | "
             "before + retry/fork/edit links | after | origins found |",
             "|---|---|---|---|---|---|---|---|"]
    for h, a in sorted(by.items()):
        origins = ", ".join(f"{o} {a['origins'][o]}" for o in ORIGINS if a["origins"].get(o))
        lines.append(f"| {h} | {' + '.join(a['sessions'])} | {a['calls']} | {a['chains']} | "
                     f"{a['before'] / a['calls']:.0%} ({a['before']}) | {a['forest'] / a['calls']:.0%} "
                     f"({a['forest']}) | {a['after'] / a['calls']:.0%} ({a['after']}) | {origins} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("harnesses", nargs="*", help="only these (default: every recorded harness)")
    ap.add_argument("--json", help="also write the per-session rows here")
    args = ap.parse_args(argv)
    from polar_mq.cli.embedded_redis import start_embedded

    paths = [p for p in lineage_replay.fixtures() if not args.harnesses or p.parent.name in args.harnesses]
    if not paths:
        raise SystemExit("no fixtures under tests/replays/lineage (scripts/record_lineage.py records them)")
    log_dir = Path(tempfile.mkdtemp(prefix="polar-bench-lineage-"))
    rows = []
    redis = start_embedded()
    try:
        for p in paths:
            row = measure(p, log_dir, redis.url)
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    finally:
        redis.stop()
    print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    print(f"(load: {os.getloadavg()[0]:.1f}; logs in {log_dir})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
