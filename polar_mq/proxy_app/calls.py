"""Calls in flight at the gateway: the task's sampling policy over the harness's, and upstream
work stopped as soon as nobody wants it.

- Every call of a session is sent with the session's sampling policy (`agent.sampling` of its
  task, given at `POST /sessions`) applied over what the harness asked for; the record keeps
  both (`params` as sent, `requested_params`).
- Each generation is registered while it runs (per session in Redis, so postrun can wait for the
  calls still in flight before it builds) and watched by one thread per gateway process. When
  its session is cancelled (`POST /sessions/<id>/cancel`: a task cancel or a harness stopped at
  its budget), or its client went away, the upstream stops the generation. A streamed call's
  upstream connection is closed (vLLM aborts a streamed request whose connection closes). A
  plain call goes upstream plain, named by its call id, and is aborted by that id (vLLM's
  `/abort_requests`, served in dev mode as its RL API is); where the upstream cannot abort by
  id, plain calls are streamed from the upstream internally and assembled into the same result
  (vLLM runs a plain request to its end when its connection closes).
- What was sampled before the abort stays in the record (status `error`, error `cancelled: ...`).

Tests: tests/pipeline/test_cancel.py, tests/gateway/test_stream_handover.py.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Generator

from polar_mq import sampling
from polar_mq._io.idle_socket import peer_closed
from polar_mq._io.locks import short_lock
from polar_mq.model import CaptureRecord
from polar_mq.store.core import GatewayStore, StoreUnavailable
from polar_mq.proxy_app.adapters.base import ChatRequest, ChatResult, GatewayError
from polar_mq.proxy_app.upstream.pool import IDLE, NoStreamIds, StreamAccumulator, UpstreamPool, abort_id

if TYPE_CHECKING:
    from polar_mq.proxy_app.upstream.pool import UpstreamStream

log = logging.getLogger("polar_mq.calls")

CLIENT_GONE = "the client closed its connection"
YIELD_EVERY = 0.002  # s: the longest a stream reader with data always buffered runs without yielding
BATCH_MAX = 64  # upstream chunks at most in one batch of events (one frame to the client)
ABORT_RESEND = 0.5  # s: between abort requests for a plain call until its answer is in
ABORT_TRIES = 20


def _cycle_loop_gevent() -> None:
    # gevent.sleep(0) only queues this greenlet behind the callbacks already due: it may run again
    # before the event loop polls I/O or fires timers (gevent's own docs), so the call watcher
    # (a timer, then a Redis reply), the writer to the client and the other streams stayed
    # starved. Any positive sleep resumes it only after the next loop iteration, which polls I/O
    # and runs the due timers first; a microsecond costs no real time beyond that iteration.
    import gevent
    gevent.sleep(1e-6)


def _cycle_threads() -> None:
    time.sleep(0)  # a real thread: gives up the GIL to the watcher, the writer and the others


def yield_now() -> None:
    """Let every other thread or greenlet of this process run once (under gevent: one full turn of
    the event loop, I/O and timers included)."""
    _yield_impl()


def _pick_yield() -> Callable[[], None]:
    try:
        from gevent import monkey
    except ImportError:
        return _cycle_threads
    return _cycle_loop_gevent if monkey.is_module_patched("socket") else _cycle_threads


def _yield_impl() -> None:  # resolved on first use: the gevent worker patches before it serves
    global _yield_impl
    _yield_impl = _pick_yield()
    _yield_impl()
SESSION_CANCELLED = "the session was cancelled"


class SessionPolicies:
    """Sampling policy per session, read once (a session's policy never changes); bounded LRU."""

    def __init__(self, store: GatewayStore, max_sessions: int = 4096):
        self.store = store
        self.max_sessions = max_sessions
        self._cache: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self._lock = short_lock()

    def get(self, session_id: str) -> dict[str, Any]:
        with self._lock:
            if session_id in self._cache:
                self._cache.move_to_end(session_id)
                return self._cache[session_id]
        session = self.store.get_session(session_id)
        policy = dict(session.sampling or {}) if session is not None else {}
        with self._lock:
            self._cache[session_id] = policy
            while len(self._cache) > self.max_sessions:
                self._cache.popitem(last=False)
        return policy


def enforce(req: ChatRequest, policy: dict[str, Any]) -> dict[str, Any]:
    """Apply the policy to `req.params` in place; returns what the harness requested."""
    requested = dict(req.params)
    req.params = sampling.apply(requested, policy)
    return requested


@dataclass
class Inflight:
    """One generation in flight: why it was aborted (None while wanted) and how to stop it."""

    session_id: str
    call_id: str
    client_socket: socket.socket | None = None  # watched for a closed connection
    reason: str | None = None
    _closers: list[Callable[[], None]] = field(default_factory=list)
    _lock: Any = field(default_factory=short_lock)

    def on_abort(self, closer: Callable[[], None]) -> None:
        with self._lock:
            self._closers.append(closer)
            fire = self.reason is not None
        if fire:
            closer()

    def abort(self, reason: str) -> None:
        with self._lock:
            if self.reason is not None:
                return
            self.reason = reason
            closers, self._closers = list(self._closers), []
        for close in closers:
            try:
                close()
            except Exception:  # closing a broken connection must not raise
                pass

    def error(self, started: bool = True) -> GatewayError:
        """A 403 in the client's shape: retrying cannot help a cancelled session."""
        what = "the upstream generation was aborted" if started else "no new generations are started"
        return GatewayError("permission", f"cancelled: {self.reason}; {what}", retryable=False)


def client_closed(sock: socket.socket | None) -> bool:
    """Whether the peer closed this (idle) client connection: readable with nothing to read.
    (select.select here aborted every call whose client socket had a descriptor >= 1024 as "client
    gone": half of 1,024 concurrent streams in bench/bench_gateway_streams.py.)"""
    return peer_closed(sock)


class CallRegistry:
    """The gateway process's calls in flight, watched by one thread: session cancellations (from
    Redis, one pipeline per tick for all sessions) and closed client connections abort them."""

    def __init__(self, store: GatewayStore, interval: float = 0.25, gateway_id: str | None = None):
        self.store = store
        self.gateway_id = gateway_id  # names this process in the calls it registers itself
        self.interval = interval
        self._calls: dict[str, Inflight] = {}
        self._lock = short_lock()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def start(self, session_id: str, call_id: str, client_socket: socket.socket | None = None,
              cancelled: bool | None = None) -> Inflight:
        """Register a generation; refused (GatewayError) when its session is already cancelled.
        `cancelled`: the admission script (admission.py) already registered it in Redis and
        says whether the session was cancelled; None: register here (one round trip)."""
        call = Inflight(session_id, call_id, client_socket)
        try:
            if cancelled is None:
                cancelled = not self.store.call_started(session_id, call_id, self.gateway_id)
            if cancelled:
                call.reason = SESSION_CANCELLED
                raise call.error(started=False)
        except StoreUnavailable:
            pass  # recording still works through the spool; cancellation is best effort then
        with self._lock:  # a short lock (locks.py): the watcher starts outside it
            self._calls[call_id] = call
            watcher = None
            if self._thread is None:
                watcher = self._thread = threading.Thread(target=self._watch, name="call-watch", daemon=True)
        if watcher is not None:
            watcher.start()
        return call

    def finish(self, call: Inflight, stored: bool = False) -> None:
        """After the record is stored: the call no longer counts as in flight. `stored`: its
        in-flight entry left Redis in the record's own MULTI (admission.leave)."""
        with self._lock:
            self._calls.pop(call.call_id, None)
        if stored:
            return
        try:
            self.store.call_finished(call.session_id, call.call_id)
        except StoreUnavailable:
            pass

    def abort_session(self, session_id: str, reason: str = SESSION_CANCELLED) -> int:
        """Abort this process's calls of a session now (the cancel request reached this process):
        the watcher's next Redis tick would find the flag too, but under load that tick can come
        seconds late (a fast model fills thousands of tokens meanwhile). Returns how many."""
        with self._lock:
            calls = [c for c in self._calls.values() if c.session_id == session_id and c.reason is None]
        for call in calls:
            call.abort(reason)
        return len(calls)

    def _watch(self) -> None:
        while not self._stop.wait(self.interval):
            with self._lock:
                calls = list(self._calls.values())
            if not calls:
                continue
            for call in calls:
                if call.reason is None and client_closed(call.client_socket):
                    call.abort(CLIENT_GONE)
            sessions = sorted({c.session_id for c in calls if c.reason is None})
            try:
                cancelled = self.store.cancelled_sessions(sessions)
            except StoreUnavailable:
                continue
            except Exception:  # the watcher must keep running
                log.exception("cancellation check failed")
                continue
            for call in calls:
                if call.session_id in cancelled:
                    call.abort(SESSION_CANCELLED)

    def close(self) -> None:
        self._stop.set()


def client_socket(environ: dict[str, Any]) -> socket.socket | None:
    """The client's connection under gunicorn or werkzeug (None where the server hides it)."""
    sock = environ.get("gunicorn.socket") or environ.get("werkzeug.socket")
    sock = getattr(sock, "socket_under", sock)  # lean_worker.ReplaySocket: the socket itself
    return sock if isinstance(sock, socket.socket) else None


def read_stream(handle: "UpstreamStream", call: Inflight, acc: StreamAccumulator,
                on_events: Callable[[list], None] | None = None) -> GatewayError | None:
    """Feed an open upstream stream into `acc` to its end or until the call is aborted (the
    connection is closed at once, which is how vLLM learns to stop); returns the abort error."""
    steps = stream_events(handle, call, acc)
    while True:
        try:
            kind, payload = next(steps)
        except StopIteration as stop:
            return stop.value
        if kind == "events" and on_events is not None:
            on_events(payload)


def stream_events(handle: "UpstreamStream", call: Inflight,
                  acc: StreamAccumulator) -> Generator[tuple[str, Any], None, GatewayError | None]:
    """read_stream as a generator, for a reader that writes the events out itself: it yields
    ("events", [...]) per batch (the chunks that had arrived when one was parsed, up to
    BATCH_MAX: one frame to the client for them, not one per chunk), ("idle", None) when the
    stream is in idle mode and the upstream was quiet, and once, after the first events,
    ("direct", handle): the point from which the stream may be read by another thread (core.py
    hands it to the client's writer). Returns the abort error."""
    call.on_abort(handle.close)
    last_yield = time.monotonic()
    offered = False
    events: list = []
    batched = 0  # chunks in `events`
    error: GatewayError | None = None
    try:
        for chunk in handle.chunks():
            if chunk is IDLE:
                yield "idle", None
                continue
            events.extend(acc.feed(chunk))
            batched += 1
            if call.reason is not None:
                break
            more = handle.ready()
            if more and batched < BATCH_MAX:  # more is here already: the same frame
                continue
            batched = 0
            if events:
                yield "events", events
                events = []
                if not offered:
                    offered = True
                    yield "direct", handle
            # Let the others run: under the gevent worker a reader whose socket always has data
            # buffered never blocks, so it would starve the call watcher (cancel, client gone),
            # the writer to its client and the other streams of its process until the generation
            # ends (then the abort comes too late: vLLM has finished). At least every YIELD_EVERY
            # s of reading while data keeps coming, not after every chunk: a switch per chunk is
            # a hub round per token, and the writer then writes each token on its own (one send
            # per frame). The yield is a full turn of the event loop (yield_now), not sleep(0).
            # A reader with nothing more here is about to wait on its socket, which lets the
            # others run anyway: at a decode pace (tens of milliseconds a token) yielding there
            # too would be one more turn of the loop per token.
            now = time.monotonic()
            if not more and handle.sees_socket:
                last_yield = now
            elif now - last_yield >= YIELD_EVERY:
                yield_now()
                last_yield = time.monotonic()
    except GatewayError as exc:
        if call.reason is None:
            error = exc
    if events:  # what arrived before the end, the abort or the failure still goes out
        yield "events", events
    if error is not None:
        raise error
    if call.reason is not None:
        handle.close()
        return call.error()
    return None


class UpstreamAborter:
    """Stops one plain request upstream by its id, from the thread that aborts the call (the
    watcher, a cancel request): on a thread of its own, so neither waits on the upstream. The
    abort is sent again every ABORT_RESEND s until the answer is in: vLLM ignores an id it has
    not admitted yet (a request still being rendered and tokenized), and aborts it once it has."""

    def __init__(self, pool: UpstreamPool, engine_id: str):
        self.pool = pool
        self.engine_id = engine_id
        self.url: str | None = None  # the upstream the request went to (the last one tried)
        # The event exists only once an abort starts (most calls are never aborted, and an
        # Event is not free to make). Each side writes its own field before
        # reading the other's, so an answer and an abort that cross still meet.
        self._done = False
        self._answered: threading.Event | None = None

    def sent_to(self, url: str) -> None:
        self.url = url

    def start(self) -> None:
        answered = self._answered = threading.Event()
        if self._done:
            answered.set()
        threading.Thread(target=self._run, args=(answered,), name="upstream-abort", daemon=True).start()

    def answered(self) -> None:
        self._done = True
        answered = self._answered
        if answered is not None:
            answered.set()

    def _run(self, answered: threading.Event) -> None:
        for _ in range(ABORT_TRIES):
            if answered.is_set():
                return
            if self.url is not None:
                self.pool.abort(self.url, [self.engine_id])
            if answered.wait(ABORT_RESEND):
                return


def abortable_chat(pool: UpstreamPool, body: dict[str, Any], record: CaptureRecord,
                   call: Inflight) -> tuple[ChatResult, str]:
    """A plain generation sent plain, named by the call's id (`X-Request-Id`), and stopped by
    that id when the call is aborted: vLLM then answers at once with what it sampled so far
    (finish_reason "abort"), which the caller keeps. Half the upstream's work and the gateway's
    of a streamed answer (one body instead of a chunk per token) on the most common small call."""
    if call.reason is not None:
        raise call.error(started=False)
    request_id = f"polar-{record.call_id}"
    aborter = UpstreamAborter(pool, abort_id(request_id))

    def sent_to(url: str) -> None:
        if call.reason is not None:  # aborted during a retry's backoff: no new attempt
            raise call.error()
        aborter.sent_to(url)

    call.on_abort(aborter.start)
    try:
        result, url = pool.chat(body, record.session_id, request_id=request_id, on_attempt=sent_to)
    except GatewayError:
        if call.reason is None:
            raise
        raise Aborted(call.error(), None, aborter.url or "") from None
    finally:
        aborter.answered()
    if call.reason is not None:
        raise Aborted(call.error(), result, url)
    return result, url


def plain_chat(pool: UpstreamPool, body: dict[str, Any], record: CaptureRecord, call: Inflight,
               stream_ok: bool) -> tuple[ChatResult, str]:
    """A non-streamed generation that can still be aborted: sent plain when the upstream stops
    requests by id (abortable_chat); else streamed from the upstream and assembled, when the
    upstream streams token ids; else one plain request (which then runs to its end upstream).
    Partial results of an aborted call are kept by the caller."""
    if stream_ok and pool.can_abort(record.session_id):
        return abortable_chat(pool, body, record, call)
    if stream_ok and pool.can_stream(record.session_id):
        stream_body = {**body, "stream": True, "stream_options": {"include_usage": True}}
        try:
            handle = pool.open_stream(stream_body, record.session_id)
        except NoStreamIds:
            handle = None
        if handle is not None:
            acc = StreamAccumulator()
            try:
                err = read_stream(handle, call, acc)
            finally:
                handle.release()
            if err is not None:
                raise Aborted(err, acc.result() if acc.started else None, handle.url)
            if not acc.finished:
                raise GatewayError("upstream_error", f"upstream {handle.url} ended the stream before "
                                   "its answer finished")
            result = acc.result()
            if result.completion_token_ids is None or result.notes:
                pool.mark_no_stream_ids(handle.url)
            return result, handle.url
    if call.reason is not None:
        raise call.error()
    return pool.chat(body, record.session_id)


class Aborted(Exception):
    """A generation aborted mid-way: the error for the client and what was sampled so far."""

    def __init__(self, error: GatewayError, partial: ChatResult | None, url: str):
        super().__init__(error.message)
        self.error = error
        self.partial = partial
        self.url = url
