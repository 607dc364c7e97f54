"""Which recorded call a request continues, without reading the whole session on every call.

`matching.find_parent` compares the request with every recorded call of its session, and its
caller read every record of the session from Redis first (all envelopes and the whole chunk hash)
and decoded them: per call a cost in proportion to the session's length, quadratic over the
session (bench/bench_tito.py and bench/bench_tito_index.py measure it; figures in
docs/benchmarks.md). Guarded by tests/tito/test_tito_index.py.

`SessionIndex` keeps, per session and per gateway process, what matching needs of each recorded
call (a `Candidate`: a digest of its messages as a history prefix, the first few message digests,
its tools' digest, its reply's signature, why it cannot be continued) and reads from Redis only
the records stored since its last look (their envelopes, and the message chunks it has not seen;
chunks are content-addressed, so a message digest is computed once per session). A match is then
a few digest comparisons per recorded call. The parent is read whole (its position in the
session's list: two round trips) and checked against the request with `find_parent`'s own
comparisons before it is used, so what a call continues is exactly what `find_parent` would pick;
tests/tito/test_tito_index.py compares the two on generated sessions.

Digests are SHA-256 of `repr(message_key(m))`, chained over a history. Keys whose parts compare
equal with different reprs (`1` and `1.0` as a role) are told apart here: such a request is not
continued (it is rendered from messages) where `find_parent` would have continued it.
Requests whose first dialogue message sits deeper than `HEAD` messages go through `find_parent`.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from polar_mq.store import codec as record_codec
from polar_mq._io.locks import short_lock
from polar_mq.model import CaptureRecord
from polar_mq.store.core import GatewayStore
from polar_mq.proxy_app.tito.matching import (SYSTEM_ROLES, Match, find_parent, matches_reply, message_key,
                                              reply_signature, same_reply, tools_key, unusable)

HEAD = 8  # message digests kept from the start of each recorded history
DIGEST = 16
MAX_SESSIONS = 1024  # sessions indexed per process (least recently used dropped; rebuilt on use)


def message_digest(message: Any) -> bytes:
    return hashlib.sha256(repr(message_key(message) if isinstance(message, dict) else message)
                          .encode("utf-8", "surrogatepass")).digest()[:DIGEST]


def chain(digests: list[bytes]) -> list[bytes]:
    """Prefix digests of a history: out[k] names its first k messages (out[0] the empty one)."""
    out = [b""]
    for d in digests:
        out.append(hashlib.sha256(out[-1] + d).digest()[:DIGEST])
    return out


def tools_digest(tools: Any) -> bytes:
    return hashlib.sha256(tools_key(tools).encode("utf-8", "surrogatepass")).digest()[:DIGEST]


@dataclass(slots=True)
class Candidate:
    """What matching needs of one recorded generation (~0.3 KB plus its reply's text: digests
    are kept as one bytes object each, not lists of them)."""

    index: int  # position in the session's list of records
    call_id: str
    started_at: float
    n: int  # messages in its history
    full: bytes | None  # prefix digest of its whole history (None: a chunk was missing)
    head: bytes  # digests of its first HEAD messages, DIGEST bytes each
    head_prefix: bytes  # prefix digests of its first 1..HEAD messages, DIGEST bytes each
    tools: bytes
    reply: tuple[Any, ...] | None  # matching.reply_signature of its reply
    problem: str | None  # matching.unusable


class _Session:
    __slots__ = ("count", "items", "messages", "tools")

    def __init__(self) -> None:
        self.count = 0  # records of the session's list read so far
        self.items: list[Candidate] = []
        self.messages: dict[bytes, bytes] = {}  # chunk digest -> message digest
        self.tools: dict[bytes, bytes] = {}  # chunk digest -> tools digest


class SessionIndex:
    def __init__(self, store: GatewayStore, max_sessions: int = MAX_SESSIONS):
        self.store = store
        self.max_sessions = max_sessions
        self._sessions: OrderedDict[str, _Session] = OrderedDict()
        self._lock = short_lock()

    # --- reading what is new ------------------------------------------------------------------
    def _session(self, session_id: str) -> _Session:
        with self._lock:
            entry = self._sessions.get(session_id)
            if entry is None:
                entry = self._sessions[session_id] = _Session()
                while len(self._sessions) > self.max_sessions:
                    self._sessions.popitem(last=False)
            else:
                self._sessions.move_to_end(session_id)
            return entry

    def candidates(self, session_id: str) -> list[Candidate]:
        """The session's recorded generations in `find_parent`'s order (started_at, then as
        stored), brought up to date with Redis (records stored since the last look only)."""
        entry = self._session(session_id)
        start = entry.count
        length, blobs = self.store.call_blobs_since(session_id, start)
        if length < start:  # the list is shorter than what was read: collected; start again
            with self._lock:
                self._sessions[session_id] = entry = _Session()
            start, (length, blobs) = 0, self.store.call_blobs_since(session_id, 0)
        fresh = self._candidates(session_id, entry, start, blobs) if blobs else []
        with self._lock:
            # Another greenlet may have read some of these meanwhile: keep what it did not.
            fresh = [c for c in fresh if c.index >= entry.count]
            if fresh:
                entry.items.extend(fresh)
                # find_parent's order; records usually arrive in it already (sorting a sorted
                # list is one pass), a spooled record replayed late does not
                entry.items.sort(key=lambda c: (c.started_at, c.index))
            entry.count = max(entry.count, start + len(blobs))
            return list(entry.items)

    def _candidates(self, session_id: str, entry: _Session, start: int, blobs: list[bytes]) -> list[Candidate]:
        envs: list[tuple[int, dict[str, Any] | None, bytes]] = []
        messages: set[bytes] = set()  # chunks to read: messages and tools not digested yet, replies
        tools: set[bytes] = set()
        replies: set[bytes] = set()
        for i, blob in enumerate(blobs):
            env = record_codec.envelope(blob)
            if env is not None:
                if env.get("kind", "generation") != "generation":
                    continue
                messages.update(m for m in env.get("messages") or [] if isinstance(m, bytes) and m not in entry.messages)
                if isinstance(env.get("tools"), bytes) and env["tools"] not in entry.tools:
                    tools.add(env["tools"])
                if isinstance(env.get("response_message"), bytes):
                    replies.add(env["response_message"])
            envs.append((start + i, env, blob))
        values = {digest: record_codec.chunk_value(raw)
                  for digest, raw in self.store.chunks(session_id, messages | tools | replies).items()}
        for digest in messages & values.keys():  # chunks are content-addressed: digest each once
            entry.messages[digest] = message_digest(values[digest])
        for digest in tools & values.keys():
            entry.tools[digest] = tools_digest(values[digest])
        out: list[Candidate] = []
        for index, env, blob in envs:
            cand = self._candidate(index, env, blob, entry, values)
            if cand is not None:
                out.append(cand)
        return out

    @staticmethod
    def _candidate(index: int, env: dict[str, Any] | None, blob: bytes, entry: _Session,
                   values: dict[bytes, Any]) -> Candidate | None:
        if env is None:  # a whole-record blob from before the envelope layout
            rec = record_codec.decode(blob, {})
            if rec.kind != "generation":
                return None
            env = {"call_id": rec.call_id, "started_at": rec.started_at, "messages": rec.messages,
                   "tools": rec.tools, "response_message": rec.response_message, "status": rec.status,
                   "prompt_token_ids": rec.prompt_token_ids, "completion_token_ids": rec.completion_token_ids}
        digests: list[bytes] = []
        complete = True
        for m in env.get("messages") or []:
            if isinstance(m, bytes):
                d = entry.messages.get(m)
                if d is None:
                    complete = False
                    break
                digests.append(d)
            else:
                digests.append(message_digest(m))
        tools = env.get("tools")
        if isinstance(tools, bytes):
            tools_d = entry.tools.get(tools)
            if tools_d is None:
                complete = False
                tools_d = b""
        else:
            tools_d = tools_digest(tools)
        reply = env.get("response_message")
        if isinstance(reply, bytes):
            reply = values.get(reply)
            if reply is None:
                complete = False
        n = len(env.get("messages") or [])
        prefix = chain(digests) if complete else [b""]
        return Candidate(
            index=index, call_id=env.get("call_id", ""), started_at=env.get("started_at", 0.0), n=n,
            full=prefix[-1] if complete else None, head=b"".join(digests[:HEAD]),
            head_prefix=b"".join(prefix[1:HEAD + 1]),
            tools=tools_d, reply=reply_signature(reply) if isinstance(reply, dict) else None,
            problem=unusable(env.get("status", "ok"), reply is not None, bool(env.get("prompt_token_ids")),
                             bool(env.get("completion_token_ids"))))

    # --- matching -----------------------------------------------------------------------------
    def find_parent(self, session_id: str, messages: list[dict[str, Any]],
                    tools: list[dict[str, Any]] | None) -> Match:
        """`matching.find_parent(messages, tools, store.calls(session_id))`, from the index."""
        first_dialogue = next((i for i, m in enumerate(messages) if m.get("role") not in SYSTEM_ROLES),
                              len(messages))
        if first_dialogue + 2 > HEAD:
            return find_parent(messages, tools, self.store.calls(session_id))
        cands = self.candidates(session_id)
        digests = [message_digest(m) for m in messages]
        prefix = chain(digests)
        want_tools = tools_digest(tools)
        shares_start = False
        retry_of = None
        total = len(messages)
        extended: list[tuple[int, Candidate]] = []  # (position in find_parent's order, candidate)
        for pos, c in enumerate(cands):
            n = c.n
            if n == 0 or c.full is None:
                continue
            full = n <= total and prefix[n] == c.full  # the request starts with its whole history
            if full and n == total and retry_of is None and c.tools == want_tools:
                retry_of = c.call_id
            if not shares_start and first_dialogue < total and (
                    (first_dialogue < min(n, total) and prefix[first_dialogue + 1] == _at(c.head_prefix, first_dialogue))
                    or any(digests[first_dialogue] == _at(c.head, j) for j in range(min(first_dialogue + 2, n)))):
                shares_start = True
            if full and total >= n + 2:
                extended.append((pos, c))
        # find_parent keeps the last of the largest (n, started_at) whose reply the request echoes
        # and that can be continued: try those from the top (in a linear conversation the first
        # one tried is it: one reply comparison, not one per recorded call).
        best: Candidate | None = None
        blocked: tuple[int, str, str] | None = None  # the first in find_parent's order
        for pos, c in sorted(extended, key=lambda pc: (pc[1].n, pc[1].started_at, pc[0]), reverse=True):
            if c.reply is None or not matches_reply(messages[c.n], c.reply):
                continue
            problem = "tools_changed" if c.tools != want_tools else c.problem
            if problem:
                if blocked is None or pos < blocked[0]:
                    blocked = (pos, problem, c.call_id)
                continue
            best = c
            break
        if best is not None:
            parent = self.store.call_at(session_id, best.index)
            if parent is None or parent.call_id != best.call_id or not _continues(messages, tools, parent):
                # the list changed under the index (collected), or digests disagreed: decide from
                # the records themselves
                self.forget(session_id)
                return find_parent(messages, tools, self.store.calls(session_id))
            return Match(parent, "continued", retry_of, parent.call_id)
        if blocked is not None:
            return Match(None, blocked[1], retry_of, blocked[2])
        if not cands:
            return Match(None, "first_call", retry_of)
        return Match(None, "edited_history" if shares_start else "new_conversation", retry_of)

    def forget(self, session_id: str) -> None:
        with self._lock:
            self._sessions.pop(session_id, None)


def _at(digests: bytes, i: int) -> bytes:
    return digests[i * DIGEST:(i + 1) * DIGEST]


def _continues(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, parent: CaptureRecord) -> bool:
    """`find_parent`'s own test that `messages` continue `parent` (its history, its reply, then more)."""
    n = len(parent.messages or [])
    if len(messages) < n + 2 or parent.response_message is None:
        return False
    if any(messages[i] != m and message_key(messages[i]) != message_key(m) for i, m in enumerate(parent.messages)):
        return False
    return same_reply(messages[n], parent.response_message) and tools_key(parent.tools) == tools_key(tools)
