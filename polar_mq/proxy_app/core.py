"""The gateway core, without a web framework: plain arguments in, a JSON reply or a frame
iterator out (app.py is the Flask layer that turns requests into these calls and replies into
responses).

Flow of a generation: adapter.to_chat → sampling policy → admission (one Redis script:
admission.py) → upstream chat (with token ids) → CaptureRecord stored in Redis in one MULTI with
the call's exit from flight → adapter.from_chat back to the client. A streamed generation
streams from the upstream too: each chunk becomes normalised events (vllm_wire.StreamAccumulator),
which the adapter's translator turns into provider frames at once; the record is stored before
the final event goes out.

Tests: tests/gateway/test_gateway.py, tests/gateway/test_gateway_inprocess.py, tests/gateway/test_stream_handover.py.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import socket
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, Generator, Iterator

from polar_mq._io.locks import short_lock
from polar_mq.model import CaptureRecord, new_id
from polar_mq.store.pause import PauseState
from polar_mq.settings import GatewaySettings
from polar_mq.store.core import GatewayStore, StoreUnavailable
from polar_mq.proxy_app.adapters.base import FINISH, PING, Adapter, ChatRequest, ChatResult, GatewayError, StreamEvent, replay
from polar_mq.proxy_app.adapters.registry import ADAPTERS, adapter  # noqa: F401 - re-exported (app.py)
from polar_mq.proxy_app.admission import CANCELLED, UNKNOWN_KEY, Admission, Entry, Ticket
from polar_mq.proxy_app.calls import CLIENT_GONE, Aborted, CallRegistry, Inflight, SessionPolicies, enforce, plain_chat, stream_events
from polar_mq.proxy_app.capture import PendingRecord, Recorder, fill_error, fill_partial, fill_result, new_record
from polar_mq.proxy_app.pause import PauseGate, _redis_error
from polar_mq.proxy_app.tito import Tito
from polar_mq.proxy_app.upstream.pool import NoStreamIds, StreamAccumulator, UpstreamPool
from polar_mq.proxy_app.versions import split_stream

log = logging.getLogger("polar_mq.gateway")

KEY_CACHE_SIZE = 65536  # session keys remembered per process (~150 B each)
@dataclass
class Outcome:
    result: ChatResult | None
    error: GatewayError | None
    after: Callable[[], None] | None = None  # completes the record's storing (Gateway.call, defer)


@dataclass
class CallContext:
    """What the web layer knows about a call beyond its body (plain values, no Flask)."""

    retry_count: int = 0  # the SDK's x-stainless-retry-count
    client_socket: socket.socket | None = None  # watched for a client that went away
    cached_key: str | None = None  # a session key resolved from the cache: re-checked at admission
    # The web layer writes a plain reply before Redis's answer to the record's MULTI is read,
    # and then runs JsonReply.after (fastpath.py). Off: the reply waits for it.
    defer_store: bool = False
    # The call's admission script, sent by the web layer before the body was parsed
    # (Gateway.admit_early): `generate` reads its answer, or withdraws it when the call fails
    # before it starts.
    entry: Entry | None = None


@dataclass
class JsonReply:
    """A JSON answer: what the web layer serialises (status, body, extra headers)."""

    status: int
    body: Any
    headers: dict[str, str] = field(default_factory=dict)
    # Set with CallContext.defer_store: must run once the reply is written (or could not be).
    after: Callable[[], None] | None = None


@dataclass
class StreamReply:
    """A streamed answer: frames to write as they come (an iterator; closing it early aborts
    the generation, as a client that went away)."""

    frames: Iterator[bytes]
    content_type: str
    headers: dict[str, str] = field(default_factory=lambda: {"Cache-Control": "no-cache",
                                                              "X-Accel-Buffering": "no"})


def error_reply(mod: Adapter, err: GatewayError) -> JsonReply:
    status, body = mod.error_response(err)
    headers = {"x-should-retry": "true" if err.retryable else "false"}
    if status in (429, 503, 529):
        headers["retry-after"] = "1"
    return JsonReply(status, body, headers)


class Storing:
    """A record whose MULTI was sent (Gateway.store_record). `wait()` reads Redis's answer and
    lets the call out of flight (the pause count, the in-flight registry), returning the error
    the client would get; `after()` is `wait()` once the client already has its answer: such
    an error (the record was spooled instead) is only logged."""

    def __init__(self, gw: "Gateway", pending: PendingRecord, inflight: Inflight, counted: bool):
        self.gw, self.pending, self.inflight, self.counted = gw, pending, inflight, counted

    def wait(self) -> GatewayError | None:
        gw, counted = self.gw, self.counted
        try:
            stored, error = self.pending.finish()
        except BaseException:
            gw.pause.release(counted)
            gw.registry.finish(self.inflight)
            raise
        if stored:
            gw.pause.released(counted)
        else:  # Redis down: each is tried on its own (and warns)
            gw.pause.release(counted)
        gw.registry.finish(self.inflight, stored=stored)
        return error

    def after(self) -> None:
        try:
            error = self.wait()
        except Exception:
            log.exception("storing call %s failed after its reply", self.pending.record.call_id)
            return
        if error is not None:
            log.error("call %s: %s (its client already had its answer)", self.pending.record.call_id, error.message)


class Handover:
    """A streamed call's reading, passed from its reader thread to the client's writer.

    The reader (Gateway.stream_call) opens the upstream stream and sends the first events
    through the channel, so that the writer's first-byte wait, early errors (with their HTTP
    status) and pings while the pause holds the call go out first; then it hands the rest of the call's steps to the
    writer, which reads the upstream itself. Each frame then costs one thread instead of two
    and no queue hop (under the gevent worker a hop is two more switches through the hub and a
    Timeout per wait). The upstream read waits at most a ping interval (idle mode: the writer
    pings when it is quiet). tests/gateway/test_stream_handover.py guards it.
    `close()` (the writer is done) makes a reader that has not handed over yet read to the end
    on its own, so the record is always finished by someone."""

    def __init__(self, channel: queue.Queue, ping_interval: float):
        self.channel = channel
        self.ping_interval = ping_interval
        self._lock = threading.Lock()
        self._closed = False

    def give(self, steps: Iterator[tuple[str, Any]], handle: Any) -> bool:
        """Called by the reader: whether the writer took the steps (else read on)."""
        if not handle.can_idle():
            return False
        with self._lock:
            if self._closed:
                return False
            handle.idle_every(self.ping_interval)
            self.channel.put(("steps", steps))
            return True

    def close(self) -> Iterator[tuple[str, Any]] | None:
        """Called by the writer when it is done: the steps handed over and never taken (the
        client left before), which the writer must then finish."""
        with self._lock:
            self._closed = True
        while True:
            try:
                kind, payload = self.channel.get_nowait()
            except queue.Empty:
                return None
            if kind == "steps":
                return payload


class StreamFrames:
    """A streamed answer's frames, as the WSGI iterable: `close()` ends the call even when no
    frame was ever asked for (the client was gone before the headers went out), which closing a
    generator that never started does not: with the stream hand-over the writer may hold the
    call's last steps, so nothing else would finish it (tests/gateway/test_stream_handover.py)."""

    def __init__(self, frames: Generator[bytes, None, None], end: Callable[[bool], None]):
        self._frames = frames
        self._end = end

    def __iter__(self) -> "StreamFrames":
        return self

    def __next__(self) -> bytes:
        return next(self._frames)

    def close(self) -> None:
        try:
            self._frames.close()  # a started generator ends itself (its finally)
        finally:
            self._end(False)  # else: the client went away before the first frame


def finish_steps(steps: Iterator[tuple[str, Any]]) -> None:
    """Run a streamed call's remaining steps to their end (its record is stored on the way);
    after an abort (the client left) that is quick: the upstream connection is closed."""
    try:
        for _ in steps:
            pass
    except Exception:
        log.exception("finishing a streamed call failed")


class Gateway:
    """Shared state of one gateway process: settings, Redis store, upstream pool, worker threads."""

    def __init__(self, settings: GatewaySettings, store: GatewayStore, pool: UpstreamPool):
        self.settings = settings
        self.store = store
        self.pool = pool
        spool = settings.spool_dir or os.path.join(os.path.expanduser("~"), ".cache", "polar_mq", "spool")
        self.recorder = Recorder(store, spool)
        self._served_model = settings.served_model
        self.pause = PauseGate(PauseState(store.r, store.keys, store.wire), max_hold=settings.pause_max_hold,
                               info=lambda: {"upstreams": list(settings.upstreams), "url": settings.base_url},
                               alive_ttl=settings.alive_ttl)
        # Streams pass through from the upstream; POLAR_STREAM_PASSTHROUGH=0 (or an upstream that
        # does not stream token ids) synthesises a stream from one non-streaming call instead.
        self.passthrough = settings.stream_passthrough
        self.policies = SessionPolicies(store)  # agent.sampling per session (calls.py)
        self.registry = CallRegistry(store, gateway_id=self.pause.gateway_id)  # calls in flight: cancellation and client disconnects
        self.admission = Admission(store.r, store.keys, self.pause.gateway_id, store.wire)  # 2 round trips a call
        self._keys: OrderedDict[str, str] = OrderedDict()  # session key -> id (admission re-checks)
        self._keys_lock = short_lock()
        self.tito = Tito(settings.tito, settings.tokenizer, pool, store)

    # --- model names ----------------------------------------------------------------------------
    @property
    def served_model(self) -> str:
        if not self._served_model:
            self._served_model = self.pool.served_model()
        if not self._served_model:
            raise GatewayError("upstream_unavailable", "no upstream answered /v1/models; "
                               "cannot tell which model to serve (pass --served-model)")
        return self._served_model

    # --- sessions -------------------------------------------------------------------------------
    def session_for(self, key: str | None) -> str:
        return self.resolve(key)[0]

    def resolve(self, key: str | None) -> tuple[str, bool]:
        """(session id, whether it came from this process's cache). A cached key is checked again
        by the call's admission script (admission.py): keys never change their session, but a
        collected session's key must stop working."""
        if not key:
            raise GatewayError("authentication", "missing session key: use the /s/<key> base URL or "
                               "send the key as the API key")
        with self._keys_lock:
            sid = self._keys.get(key)
            if sid is not None:
                self._keys.move_to_end(key)
                return sid, True
        try:
            sid = self.store.resolve_key(key)
        except StoreUnavailable as exc:
            raise GatewayError("store_unavailable", f"session store unavailable: {exc}") from exc
        if sid is None:
            raise GatewayError("authentication", "unknown session key")
        with self._keys_lock:
            self._keys[key] = sid
            while len(self._keys) > KEY_CACHE_SIZE:
                self._keys.popitem(last=False)
        return sid, False

    def forget_key(self, key: str) -> None:
        with self._keys_lock:
            self._keys.pop(key, None)

    def admit_early(self, session_id: str, key: str | None, provider: str | None = None) -> Entry:
        """Send a call's admission script now, before its body is read and converted: `generate`
        reads the answer (`enter`), so the round trip overlaps that work. `key`: a cached key to
        check again. The caller must hand the entry to `generate` or `withdraw` it."""
        return self.admission.send_enter(session_id, new_id("call"), time.time(), key, provider)

    def withdraw(self, entry: Entry) -> None:
        """A call admitted early ends before it started: out of flight again, nothing recorded."""
        ticket = entry.withdraw()
        if ticket is not None and ticket.state == UNKNOWN_KEY and entry.key:
            self.forget_key(entry.key)

    def enter(self, record: CaptureRecord, key: str | None, entry: Entry | None = None) -> Ticket | None:
        """The call's admission round trip (admission.py); None when Redis is unavailable (the
        call then goes on uncounted, as pause.py and calls.py handle it). `key`: a cached key to
        check again. `entry`: the script already sent (admit_early): its answer is read."""
        try:
            if entry is not None:
                ticket = entry.ticket()
            else:
                ticket = self.admission.enter(record.session_id, record.call_id, time.time(), key,
                                              record.provider)
        except Exception as exc:
            if not _redis_error(exc):
                raise
            return None
        if ticket.state == UNKNOWN_KEY:
            self.forget_key(key or "")
            raise GatewayError("authentication", "unknown session key")
        return ticket

    def finish(self, record: CaptureRecord, inflight: Inflight, counted: bool) -> GatewayError | None:
        """Store the record and let the call out of flight, in one MULTI (admission.leave)."""
        return self.store_record(record, inflight, counted).wait()

    def store_record(self, record: CaptureRecord, inflight: Inflight, counted: bool) -> "Storing":
        """`finish` up to the MULTI being sent: `wait()` on the result completes it."""
        sid, cid = record.session_id, record.call_id
        try:
            pending = self.recorder.send(record, lambda pipe: self.admission.leave(pipe, sid, cid, counted))
        except BaseException:
            self.pause.release(counted)
            self.registry.finish(inflight)
            raise
        return Storing(self, pending, inflight, counted)

    def base_urls(self, key: str) -> dict[str, str]:
        root = f"{self.settings.base_url}/s/{key}"
        return {"anthropic": root, "openai": f"{root}/v1", "gemini": root}

    # --- generation -----------------------------------------------------------------------------
    def upstream_body(self, req: ChatRequest, stream: bool = False) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.served_model, "messages": req.messages, **req.params,
                                "stream": stream, "logprobs": True, "return_token_ids": True}
        if stream:
            body["stream_options"] = {"include_usage": True}
        if req.tools:
            body["tools"] = req.tools
        return body

    def call(self, record: CaptureRecord, body: dict[str, Any], inflight: Inflight,
             upstream: Any = None, ticket: Ticket | None = None, defer: bool = False) -> Outcome:
        """One upstream call, recorded whatever happens; aborted when its session is cancelled or
        its client leaves (calls.py). `upstream` is the pool (messages path) or a token-in route
        (tito); both offer the same chat/open_stream interface. `defer`: return once the
        record's MULTI is sent, with `after` to complete it (Storing.after): the client's answer
        need not wait for Redis's. An error known before that (Redis unreachable, a record that
        had to be sanitized) is returned as without `defer`."""
        upstream = upstream or self.pool
        result = error = None
        counted = False
        record.started_at = time.time()
        t0 = time.monotonic()
        try:
            # Admitted (counted in flight, stamped with policy_version) or held while paused.
            counted = self.pause.admit(record, ticket)
            record.started_at = time.time()
            t0 = time.monotonic()
            result, url = plain_chat(upstream, body, record, inflight, self.passthrough)
            fill_result(record, result, url)
        except Aborted as exc:
            error = exc.error
            if exc.partial is not None:
                fill_partial(record, exc.partial, exc.url, aborted=True)
            fill_error(record, error)
        except GatewayError as exc:
            error = exc
            fill_error(record, exc)
        except Exception as exc:  # never lose the record, even on a bug
            log.exception("upstream call failed")
            error = GatewayError("internal", f"gateway error: {exc}")
            fill_error(record, error)
        record.latency_ms = round((time.monotonic() - t0) * 1000, 3)
        storing = self.store_record(record, inflight, counted)
        if defer and storing.pending.waiting:
            return Outcome(result, error, storing.after)
        stored_error = storing.wait()
        if stored_error is not None:
            return Outcome(None, stored_error)
        return Outcome(result, error)

    def generate(self, provider: str, session_id: str, body: dict[str, Any], *,
                 model: str | None = None, stream: bool | None = None,
                 extra: dict[str, Any] | None = None,
                 context: CallContext | None = None) -> JsonReply | StreamReply:
        """One generation: the provider body in, the answer out (JSON or a frame iterator)."""
        context = context or CallContext()
        entry = context.entry
        mod = adapter(provider)
        try:
            req: ChatRequest = mod.to_chat(body)
            if model:
                req.model = model
            if stream is not None:
                req.stream = stream
            req.extra.update(extra or {})
            requested = enforce(req, self.policies.get(session_id))
            record = new_record(session_id, provider, req, body, self._served_model,
                                retry_count=context.retry_count, requested_params=requested,
                                call_id=None if entry is None else entry.call_id)
            upstream = self.upstream_body(req)
        except BaseException:
            if entry is not None:  # admitted early: out of flight again
                self.withdraw(entry)
            raise
        record.model_served = upstream["model"]
        ticket = self.enter(record, context.cached_key, entry)
        # The watcher checks the client's connection of plain AND streamed calls: a stream's
        # writer notices a gone client only when a write fails, and under load it may not run
        # for seconds while the upstream keeps generating (vLLM then finishes before the abort).
        inflight = self.registry.start(session_id, record.call_id, context.client_socket,
                                       cancelled=None if ticket is None else ticket.state == CANCELLED)
        try:
            route = self.tito.route(record, req)
        except BaseException:  # admitted: leave flight again (the record is not written)
            self.abandon(record, inflight, ticket)
            raise
        if not req.stream:
            outcome = self.call(record, upstream, inflight, route, ticket, defer=context.defer_store)
            try:
                if outcome.error:
                    reply = error_reply(mod, outcome.error)
                else:
                    assert outcome.result is not None  # an Outcome holds a result or an error
                    reply = JsonReply(200, mod.from_chat(outcome.result, req))
            except BaseException:
                if outcome.after is not None:
                    outcome.after()
                raise
            reply.after = outcome.after
            return reply
        channel: queue.Queue = queue.Queue()
        handover = Handover(channel, self.settings.ping_interval)
        # One thread per streamed call (a greenlet under the gevent worker): a pool would cap
        # the open streams of a process at its size.
        threading.Thread(target=self.stream_call, args=(record, req, channel, inflight, route, ticket, handover),
                         name="upstream-stream", daemon=True).start()
        return self.stream(mod, req, channel, inflight, handover)

    def abandon(self, record: CaptureRecord, inflight: Inflight, ticket: Ticket | None) -> None:
        """A call admitted but never started (a bug on the way): out of flight, nothing recorded."""
        counted = ticket is not None and ticket.admitted
        try:
            with self.store.r.pipeline(transaction=True) as pipe:
                self.admission.leave(pipe, record.session_id, record.call_id, counted)
                pipe.execute()
        except Exception:
            log.exception("could not take call %s out of flight", record.call_id)
        self.pause.released(counted)
        self.registry.finish(inflight, stored=True)

    def stream_call(self, record: CaptureRecord, req: ChatRequest, channel: queue.Queue,
                    inflight: Inflight, upstream: Any, ticket: Ticket | None,
                    handover: "Handover") -> None:
        """Runs on a thread of its own (a greenlet under the gevent worker): the call's steps
        (`stream_steps`) into `channel`, until `handover` takes the reading over (then the
        client's writer runs the rest). Whatever goes wrong, the stream gets its last item (an
        exception must never die silently here and leave the client on pings)."""
        steps = self.stream_steps(record, req, inflight, upstream, ticket)
        try:
            for item in steps:
                if item[0] == "direct":
                    if handover.give(steps, item[1]):
                        return
                    continue
                channel.put(item)
        except BaseException as exc:
            log.exception("streamed call %s of session %s failed", record.call_id, record.session_id)
            channel.put(("error", GatewayError("internal", f"gateway error: {type(exc).__name__}")))

    def stream_steps(self, record: CaptureRecord, req: ChatRequest, inflight: Inflight,
                     upstream: Any = None, ticket: Ticket | None = None) -> Iterator[tuple[str, Any]]:
        """One streamed upstream call, recorded whatever happens, as the items a writer turns
        into frames: ("events", [...]) as the upstream produces them, ("idle", None) when it was
        quiet (idle mode), ("direct", handle) once (calls.stream_events), then, once the record
        is stored, ("finish", result) or ("error", GatewayError). When the client goes away
        or the session is cancelled the upstream connection is closed (vLLM then aborts the
        generation) and the record keeps what was sampled. An upstream that cannot stream token
        ids gets a non-streaming call, replayed as events. `upstream` is the pool
        or a token-in route (tito)."""
        upstream = upstream or self.pool
        result: ChatResult | None = None
        error: GatewayError | None = None
        acc: StreamAccumulator | None = None
        handle = None
        counted = False
        record.started_at = time.time()
        t0 = time.monotonic()
        try:
            counted = self.pause.admit(record, ticket)  # held here while paused; the client gets pings
            record.started_at = time.time()
            t0 = time.monotonic()
            if not self.passthrough:
                record.notes.append("synthetic stream: pass-through disabled (POLAR_STREAM_PASSTHROUGH=0)")
            elif upstream.can_stream(record.session_id):
                try:
                    handle = upstream.open_stream(self.upstream_body(req, stream=True), record.session_id)
                except NoStreamIds as exc:
                    record.notes.append(f"synthetic stream: upstream {exc} streams without token ids")
            else:
                record.notes.append("synthetic stream: the upstream does not stream token ids")
            if handle is not None:
                acc = StreamAccumulator()
                aborted = yield from stream_events(handle, inflight, acc)
                if aborted is not None:
                    raise aborted
                if not acc.finished:
                    raise GatewayError("upstream_error", f"upstream {handle.url} ended the stream "
                                       "before its answer finished")
                result = acc.result()
                if result.completion_token_ids is None or result.notes:
                    upstream.mark_no_stream_ids(handle.url)
                fill_result(record, result, handle.url)
                split_stream(record, acc, self.pause.state)
            else:
                result, url = plain_chat(upstream, self.upstream_body(req), record, inflight, False)
                fill_result(record, result, url)
                events = list(replay(result))
                yield "events", events[:-1]  # the finish waits for the record
        except GatewayError as exc:
            error = exc
        except Exception as exc:  # never lose the record, even on a bug
            log.exception("streamed upstream call failed")
            error = GatewayError("internal", f"gateway error: {exc}")
        finally:
            if handle is not None:
                handle.release()
        if error is not None:
            if acc is not None and acc.started and handle is not None:
                fill_partial(record, acc.result(), handle.url,
                             aborted=inflight.reason is not None)
                split_stream(record, acc, self.pause.state)
            fill_error(record, error)
        record.latency_ms = round((time.monotonic() - t0) * 1000, 3)
        stored_error = self.finish(record, inflight, counted)
        error = error or stored_error
        yield ("error", error) if error is not None else ("finish", result)

    def stream(self, mod: Adapter, req: ChatRequest, channel: queue.Queue,
               inflight: Inflight, handover: "Handover") -> JsonReply | StreamReply:
        """A streamed answer. Headers wait up to first_byte_wait for the first upstream chunk so
        that early errors keep their HTTP status; after that, keep-alive pings flow whenever the
        upstream is quiet. Frames are written as the upstream's chunks arrive: from `channel`
        while the call's reader thread reads, then, once it hands the reading over (Handover),
        from the call's steps run right here."""
        try:
            first = channel.get(timeout=self.settings.first_byte_wait)
        except queue.Empty:
            first = None
        if first is not None and first[0] == "error" and not mod.error_in_stream(first[1]):
            handover.close()  # the reader sent its last item: nothing was handed over
            return error_reply(mod, first[1])
        content_type = mod.stream_content_type(req)
        # Adapters whose clients choke on SSE comments (google-genai) supply their own keep-alive.
        ping = mod.stream_ping(req)
        interval = self.settings.ping_interval
        translator = mod.stream_translator(req)
        taken: list[Iterator[tuple[str, Any]]] = []  # the steps, once handed over

        ended: list[bool] = []

        def end(done: bool) -> None:
            if ended:
                return
            ended.append(done)
            if not done:  # the client went away: nobody wants the rest of the generation
                inflight.abort(CLIENT_GONE)
            # The record is written by whoever holds the steps: the reader thread, or here.
            left = handover.close()
            for steps in (*taken, left):
                if steps is not None:
                    finish_steps(steps)

        def frames() -> Generator[bytes, None, None]:
            done = False
            try:
                yield from frames_until_done()
                done = True
            finally:
                end(done)

        def next_step(steps: Iterator[tuple[str, Any]]) -> tuple[str, Any]:
            try:
                return next(steps)
            except StopIteration:  # the steps end with their last item: never seen
                return "error", GatewayError("internal", "gateway error: the stream ended early")
            except Exception as exc:  # as stream_call: the client still gets its last item
                log.exception("streamed call failed")
                return "error", GatewayError("internal", f"gateway error: {type(exc).__name__}")

        def frames_until_done() -> Iterator[bytes]:
            item = first
            if item is None:
                yield ping
            while True:
                if taken:  # the steps after their ("direct", _): the reader took that one
                    item = next_step(taken[0])
                    if item[0] == "idle":
                        yield ping
                        continue
                while item is None:
                    try:
                        item = channel.get(timeout=interval)
                    except queue.Empty:
                        yield ping
                # What else had already arrived goes out in the same write (fewer syscalls when the
                # upstream is faster than this connection), but never more: a reader that keeps
                # the queue non-empty must not hold the frames back.
                backlog = 0 if taken else min(channel.qsize(), 64)
                out: list[bytes] = []
                while item is not None:
                    kind, payload = item
                    if kind == "events":
                        out.extend(translator.feed_all(payload))
                    elif kind == "finish":
                        out.extend(translator.feed(StreamEvent(FINISH, result=payload)))
                        yield b"".join(out)
                        return
                    elif kind == "steps":
                        taken.append(payload)
                        backlog = 0
                    else:
                        out.extend(translator.error(payload))
                        yield b"".join(out)
                        return
                    item = None
                    if backlog > 0:
                        backlog -= 1
                        try:
                            item = channel.get_nowait()
                        except queue.Empty:
                            pass
                if out:
                    yield b"".join(out)

        return StreamReply(StreamFrames(frames(), end), content_type)

    def count_tokens(self, provider: str, session_id: str, body: dict[str, Any]) -> JsonReply:
        """Token counting answers from the upstream's tokenizer and records nothing."""
        mod = adapter(provider)
        body = mod.count_request_body(body)  # e.g. Anthropic's lacks max_tokens, Gemini's is wrapped
        req = mod.to_chat(body)
        n = self.pool.tokenize(req.messages, req.tools, self.served_model, session_id)
        if n is None:  # no upstream tokenizer: a rough estimate beats an error for a count
            n = max(1, len(json.dumps(req.messages)) // 4)
        return JsonReply(200, mod.count_tokens_response(n))


