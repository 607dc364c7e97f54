"""A session's traces as the tree the viewer draws: who spawned whom (`spawned_by`), which
conversation continues after a compaction (`continues_from`), retries and forks (`parent_trace`)
and resumptions after a prefix break (`continues_trace`). Pure; guarded by
tests/api/test_ui_views.py::test_lineage_tree_nests_subagents_and_compaction."""

from __future__ import annotations

from typing import Any

from polar_mq.model import Trace


def _parent(meta: dict[str, Any]) -> tuple[int | None, str]:
    link = meta.get("spawned_by")
    if isinstance(link, dict) and isinstance(link.get("trace_index"), int):
        return link["trace_index"], f"spawned by {link.get('tool')} ({link.get('tool_call_id')})"
    link = meta.get("continues_from")
    if isinstance(link, dict) and isinstance(link.get("trace_index"), int):
        return link["trace_index"], f"continues after {link.get('reason')}"
    if isinstance(meta.get("parent_trace"), int):
        return meta["parent_trace"], str(meta.get("origin") or meta.get("role") or "branch")
    if isinstance(meta.get("continues_trace"), int):
        return meta["continues_trace"], f"resumes after a break ({meta.get('break')})"
    return None, "root"


def lineage_tree(traces: list[Trace]) -> list[dict[str, Any]]:
    """Nodes in depth-first order: {index, parent, edge, depth, origin, role, calls, versions}.
    A link to a missing trace or one that would close a cycle makes the node a root."""
    n = len(traces)
    parent: list[int | None] = []
    edge: list[str] = []
    for t in traces:
        p, e = _parent(t.metadata or {})
        parent.append(p if p is not None and 0 <= p < n else None)
        edge.append(e if parent[-1] is not None else "root")
    for i in range(n):  # cut cycles (a malformed stored trajectory must still render)
        seen, j = {i}, parent[i]
        while j is not None:
            if j in seen:
                parent[i], edge[i] = None, "root"
                break
            seen.add(j)
            j = parent[j]
    children: dict[int | None, list[int]] = {}
    for i, p in enumerate(parent):
        children.setdefault(p, []).append(i)
    out: list[dict[str, Any]] = []

    def walk(i: int, depth: int) -> None:
        meta = traces[i].metadata or {}
        out.append({"index": i, "parent": parent[i], "edge": edge[i], "depth": depth,
                    "origin": meta.get("origin"), "role": meta.get("role"),
                    "calls": len(traces[i].call_ids),
                    "versions": [v for _o, v in traces[i].policy_versions or []]})
        for c in children.get(i, []):
            walk(c, depth + 1)

    for r in children.get(None, []):
        walk(r, 0)
    return out
