"""A compressed token trie: finds, for a prompt, every stored sequence that is a prefix of it.

Parent search must be order-independent and cheap on long sessions (50 calls of ~100k tokens).
Comparing every pair of calls is quadratic in calls *and* tokens; the trie stores each call's
prompt+completion once as slices of the original lists and walks a prompt edge by edge, comparing
whole edges with C-speed list slices instead of token-by-token Python loops.

Tests: tests/merge/test_merge.py, tests/merge/test_merge_properties.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Hashable, Sequence


def common_prefix_len(a: Sequence[int], a_at: int, b: Sequence[int], b_at: int, limit: int) -> int:
    """Length of the common prefix of a[a_at:] and b[b_at:], at most ``limit``. Compares growing
    chunks with slices, then finds the mismatch inside the last chunk."""
    done, step = 0, 64
    while done < limit:
        n = min(step, limit - done)
        if a[a_at + done:a_at + done + n] != b[b_at + done:b_at + done + n]:
            for i in range(n):
                if a[a_at + done + i] != b[b_at + done + i]:
                    return done + i
        done += n
        step = min(step * 2, 1 << 16)
    return limit


def lcp(a: Sequence[int], b: Sequence[int]) -> int:
    return common_prefix_len(a, 0, b, 0, min(len(a), len(b)))


@dataclass
class _Edge:
    seq: Sequence[int]  # the label is seq[start:end]; no copy is made
    start: int
    end: int
    child: "_Node"


@dataclass
class _Node:
    depth: int
    edges: dict[int, _Edge] = field(default_factory=dict)
    ends: list[Hashable] = field(default_factory=list)


class PrefixTrie:
    """Stores sequences under keys; ``prefixes_of(seq)`` lists (depth, keys) for every stored
    sequence that is a prefix of ``seq``, shallowest first. Key order within a depth follows
    insertion; callers that need order independence sort them."""

    def __init__(self) -> None:
        self._root = _Node(0)

    def insert(self, seq: Sequence[int], key: Hashable,
               report_upto: int = -1) -> list[tuple[int, list[Hashable]]]:
        """Store ``seq`` under ``key``. Returns what ``prefixes_of(seq[:report_upto])`` would
        have returned just before the insertion, found on the same walk (free of charge)."""
        found: list[tuple[int, list[Hashable]]] = []
        node, pos, n = self._root, 0, len(seq)
        if node.ends and report_upto >= 0:
            found.append((0, list(node.ends)))
        while pos < n:
            edge = node.edges.get(seq[pos])
            if edge is None:
                leaf = _Node(n)
                node.edges[seq[pos]] = _Edge(seq, pos, n, leaf)
                node = leaf
                break
            length = edge.end - edge.start
            k = common_prefix_len(seq, pos, edge.seq, edge.start, min(length, n - pos))
            if k < length:  # split the edge at k
                mid = _Node(pos + k)
                mid.edges[edge.seq[edge.start + k]] = _Edge(edge.seq, edge.start + k, edge.end,
                                                            edge.child)
                edge.end = edge.start + k
                edge.child = mid
            node = edge.child
            pos += k
            if node.ends and pos <= report_upto:
                found.append((pos, list(node.ends)))
        node.ends.append(key)
        return found

    def prefixes_of(self, seq: Sequence[int]) -> list[tuple[int, list[Hashable]]]:
        found: list[tuple[int, list[Hashable]]] = []
        node, pos, n = self._root, 0, len(seq)
        if node.ends:
            found.append((0, node.ends))
        while pos < n:
            edge = node.edges.get(seq[pos])
            if edge is None:
                break
            length = edge.end - edge.start
            if length > n - pos:
                break
            if common_prefix_len(seq, pos, edge.seq, edge.start, length) < length:
                break
            node, pos = edge.child, pos + length
            if node.ends:
                found.append((pos, node.ends))
        return found
