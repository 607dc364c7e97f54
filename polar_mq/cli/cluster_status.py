"""`polar-mq status --cluster`: the topology as Redis sees it.

Nodes (alive while their pools beat), the pools on each (stage, queues, concurrency), the depth
of every stage queue (shared and per-node), READY occupancy (prepared sessions waiting for a run
slot vs the buffer's capacity) and the session states. Read straight from Redis, so it works on
any host that can reach it, with or without the API.

Tests: tests/pipeline/test_many_hosts.py.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

from polar_mq.store.pipeline import PipelineStore
from polar_mq.tasks.app.routing import QUEUES
from polar_mq.tasks.app import priority


def collect(store: PipelineStore, default_capacity: int) -> dict[str, Any]:
    now = time.time()
    pools = [p for p in store.pools() if p.get("expires", 0) > now - 300]
    queues = set(QUEUES) | {q for p in pools for q in p.get("queues", [])}
    depths = priority.depths(store.r, sorted(queues))  # every dispatch_priority level counted
    recs = store.get_sessions(store.active_sessions())
    return {
        "nodes": [{"node": n, "alive": exp > now, "expires_in_s": round(exp - now, 1)}
                  for n, exp in sorted(store.nodes().items())],
        "pools": sorted(({"node": p["node"], "queues": p.get("queues", []), "concurrency": p.get("concurrency"),
                          "alive": p.get("expires", 0) > now} for p in pools),
                        key=lambda p: (p["node"], p["queues"])),
        "queues": depths,
        "unacked": store.r.hlen("unacked"),
        "ready": {"waiting": len(store.ready_list()), "slots_held": len(store.slots_held()),
                  "capacity": store.ready_capacity(default_capacity)},
        "sessions": dict(Counter(r.state for r in recs)),
        "sessions_by_node": dict(Counter(r.runtime_host or "-" for r in recs)),
    }


def render(view: dict[str, Any]) -> Any:
    from rich.console import Group
    from rich.table import Table

    nodes = Table(title="nodes")
    for col in ("node", "alive", "pools (queues × concurrency)", "active sessions"):
        nodes.add_column(col)
    for n in view["nodes"]:
        pools = [f"{','.join(p['queues'])}×{p['concurrency']}" for p in view["pools"] if p["node"] == n["node"]
                 and p["alive"]]
        nodes.add_row(n["node"], "yes" if n["alive"] else f"no ({-n['expires_in_s']:.0f} s)", "; ".join(pools),
                      str(view["sessions_by_node"].get(n["node"], 0)))
    queues = Table(title="queues")
    queues.add_column("queue")
    queues.add_column("depth", justify="right")
    for q, depth in view["queues"].items():
        queues.add_row(q, str(depth))
    queues.add_row("(unacked, held by workers)", str(view["unacked"]))
    r = view["ready"]
    ready = (f"READY buffer: {r['waiting']} prepared sessions waiting / capacity {r['capacity']} "
             f"(slots held {r['slots_held']}); sessions: "
             + ", ".join(f"{k}={v}" for k, v in sorted(view["sessions"].items())))
    return Group(nodes, queues, ready)
