"""The vLLM upstream pool (the I/O half; the wire codec is vllm_wire.py): session affinity,
health checks, bounded retries, connection reuse.

Every generation goes to vLLM's OpenAI chat endpoint with `return_token_ids` and `logprobs` so the
capture record carries the exact sampled ids. A session sticks to one upstream (rendezvous hash on
the session id) so its prefix stays in that server's KV cache; an unhealthy upstream is skipped.

Tests: tests/pipeline/test_cancel.py, tests/gateway/test_streaming.py, tests/gateway/test_http11.py.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, TypeVar, cast
from urllib.parse import urlsplit

import requests

from polar_mq.proxy_app import fastjson
from polar_mq.proxy_app.upstream import http11
from polar_mq.proxy_app.upstream.transports import (LeanTransport, ReadTimeout, Reply, RequestsReply, RequestsTransport,
                                                    Transport, UpstreamTimeout, UpstreamUnreachable, transport_for)
from polar_mq.proxy_app.adapters.base import ChatResult, GatewayError
# The wire codec (pure) lives in vllm_wire.py; these names stay importable from here.
from polar_mq.proxy_app.upstream.vllm_wire import (CHAT_PATH, COMPLETIONS_PATH, SseParser, StreamAccumulator,  # noqa: F401
                                                   _prompt_ids, chunk_error, load_answer, map_client_error,
                                                   normalise_message, parse_chat_response)

log = logging.getLogger("polar_mq.upstream")

T = TypeVar("T")
class _Retry(Exception):
    """One upstream attempt failed in a way worth retrying elsewhere."""

    def __init__(self, error: GatewayError, answered: bool = True):
        super().__init__(error.message)
        self.error = error
        self.answered = answered  # the upstream answered (5xx, broken stream) vs unreachable


def normalise_root(url: str) -> str:
    """Server root from `http://h:p`, `http://h:p/` or `http://h:p/v1`."""
    url = url.rstrip("/")
    return url[:-3] if url.endswith("/v1") else url


@dataclass
class Upstream:
    root: str
    healthy: bool = True
    token_ids: bool | None = None  # does it really return prompt/completion token ids?
    stream_token_ids: bool | None = None  # ... and when streaming (prompt ids first, ids per chunk)?
    last_error: str | None = None
    last_check: float = 0.0
    models: list[str] = field(default_factory=list)
    max_model_len: int | None = None
    token_in: bool | None = None  # does /v1/completions take a token-id prompt and return ids?
    abort_by_id: bool | None = None  # does it abort a request by its id (POST /abort_requests)?

    def describe(self) -> dict[str, Any]:
        return {"url": self.root, "healthy": self.healthy, "token_ids": self.token_ids,
                "stream_token_ids": self.stream_token_ids, "models": self.models,
                "max_model_len": self.max_model_len, "token_in": self.token_in,
                "abort_by_id": self.abort_by_id, "last_error": self.last_error}


def _weight(root: str, key: str) -> int:
    return int.from_bytes(hashlib.blake2b(f"{root}|{key}".encode(), digest_size=8).digest(), "big")


class NoStreamIds(Exception):
    """The upstream streamed without prompt token ids: it cannot give a trainable streamed record."""


RELEASE_WAIT = 0.05  # s: how long a finished stream's chunked terminator may take to arrive


IDLE: Any = object()  # UpstreamStream.chunks in idle mode: the upstream sent nothing for a while


class UpstreamStream:
    """An open streaming chat completion: its SSE `data:` payloads, parsed, as they arrive.

    Idle mode (`idle_every`, for a reader that also keeps its client alive with pings): a wait
    for bytes longer than the interval gives IDLE among the chunks instead of blocking on; the
    stream still fails as stalled once it was quiet for the pool's read timeout in all."""

    def __init__(self, resp: Reply, url: str):
        self.resp = resp
        self.url = url
        self.done = False
        self._sse = SseParser()
        self._pending: dict[str, Any] | None = None
        self._ready: deque[bytes] = deque()  # payloads of the last read not yet parsed
        self._idle: float | None = None
        self._stall = 0.0  # s: the read timeout the idle waits add up to

    def can_idle(self) -> bool:
        """Whether idle mode works on this stream (its transport's read timeout leaves the
        answer readable: the lean client's does, urllib3's may not)."""
        return self.resp.can_idle

    def idle_every(self, seconds: float) -> None:
        """Switch to idle mode (can_idle() must hold)."""
        resp = self.resp
        self._stall = resp.read_timeout()
        self._idle = min(seconds, self._stall)
        resp.set_read_timeout(self._idle)

    @property
    def sees_socket(self) -> bool:
        """Whether ready() looks at the socket too (the lean client), so that not ready means the
        next read waits; urllib3 buffers what it read out of sight."""
        return self.resp.can_idle

    def ready(self) -> bool:
        """Whether the next chunk is already here (parsed from the last read, or arrived on the
        socket): a reader that writes each batch out (calls.stream_events) writes what is here
        in one frame, as the queue to the writer gathered it when a reader thread ran ahead."""
        if self._ready:
            return True
        return self.resp.arrived()

    def _payloads(self) -> Iterator[bytes]:
        raw = self.resp
        ready = self._ready
        quiet = 0.0
        while True:
            while ready:
                yield ready.popleft()
            try:
                piece = raw.read1(65536)
            except ReadTimeout:
                idle = self._idle
                if idle is None:
                    raise
                quiet += idle
                if quiet >= self._stall:
                    raise
                yield IDLE
                continue
            quiet = 0.0
            if not piece:
                yield from self._sse.end()
                return
            ready.extend(self._sse.feed(piece))

    def _next(self, it: Iterator[bytes], first: bool = False) -> dict[str, Any] | None:
        """The next chunk (or IDLE); None at [DONE] or the end. Transport failures become
        GatewayErrors. The first chunk's prompt ids stay text (vllm_wire.load_answer)."""
        try:
            for data in it:
                if data is IDLE:
                    return cast("dict[str, Any]", IDLE)
                if data.strip() == b"[DONE]":
                    self.done = True
                    return None
                try:
                    chunk = load_answer(data, fastjson.loads) if first else fastjson.loads(data)
                except ValueError as exc:
                    raise GatewayError("upstream_error", f"upstream {self.url} sent an invalid stream "
                                       f"chunk: {exc}") from exc
                return chunk
            return None
        except requests.exceptions.RequestException as exc:
            raise _stream_failure(self.url, exc) from exc
        except Exception as exc:  # urllib3 / http.client errors while reading the body
            if isinstance(exc, GatewayError):
                raise
            raise _stream_failure(self.url, exc) from exc

    def start(self) -> dict[str, Any] | None:
        self._it = self._payloads()
        self._pending = self._next(self._it, first=True)
        return self._pending

    def chunks(self) -> Iterator[dict[str, Any]]:
        """Every chunk, the first included (IDLE among them in idle mode); ends at [DONE] or end
        of body."""
        chunk = self._pending
        self._pending = None
        while chunk is not None:
            yield chunk
            chunk = self._next(self._it)

    def close(self) -> None:
        try:
            self.resp.close()
        except Exception:  # closing a broken connection must not raise
            pass

    def release(self) -> None:
        """Done with the stream: after its [DONE] the rest of the body (the chunked terminator)
        is read briefly so the connection can serve the next call; otherwise it is closed (an
        unfinished generation is aborted upstream)."""
        if self.done:
            try:
                self.resp.finish_within(RELEASE_WAIT)
                return
            except Exception:
                pass
        self.close()


def _stream_failure(url: str, exc: BaseException) -> GatewayError:
    text = f"{type(exc).__name__}: {exc}"
    if "timed out" in text.lower() or "timeout" in type(exc).__name__.lower():
        return GatewayError("upstream_timeout", f"upstream {url} stalled mid-stream: {text}")
    return GatewayError("upstream_error", f"upstream {url} stream broke: {text}")


def error_message(resp: Reply) -> str:
    """The message of a vLLM error body (old flat shape or the newer {"error": {...}})."""
    try:
        body = resp.json()
    except ValueError:
        return resp.text[:500] or resp.reason
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict):
            return str(err.get("message") or err)
        if isinstance(err, str):
            return err
        if body.get("message"):
            return str(body["message"])
    return str(body)[:500]


JSON_HEADERS = {"Content-Type": "application/json"}
ABORT_PATH = "/abort_requests"  # vLLM's RL router (VLLM_SERVER_DEV_MODE=1) and --tokens-only servers
ABORT_TIMEOUT = 5.0  # s: vLLM answers an abort at once (the engine stops the request in the background)


def load_chat_answer(data: bytes) -> Any:
    """A plain chat answer's body, its prompt ids kept as text (vllm_wire.load_answer), as a
    streamed answer's are."""
    return load_answer(data, fastjson.loads)


def abort_id(request_id: str) -> str:
    """vLLM's name for a chat completion sent with `X-Request-Id: request_id` (serving.py:
    `chatcmpl-{_base_request_id(raw_request)}`), the id `/abort_requests` takes."""
    return f"chatcmpl-{request_id}"


class EnvOnceSession(requests.Session):
    """A requests session that reads the environment's proxy / CA-bundle settings once per
    upstream instead of on every request: requests walks all of os.environ (proxies, no_proxy)
    per call, a large share of a small call's CPU. The settings are the ones requests would use;
    a running gateway's environment does not change."""

    def __init__(self) -> None:
        super().__init__()
        self._env: dict[tuple, dict[str, Any]] = {}

    def merge_environment_settings(self, url, proxies, stream, verify, cert):  # type: ignore[override]
        if proxies:  # per-call proxies: requests' own merge
            return super().merge_environment_settings(url, proxies, stream, verify, cert)
        parts = urlsplit(url)
        key = (parts.scheme, parts.netloc, stream, verify, cert)
        settings = self._env.get(key)
        if settings is None:
            settings = self._env[key] = super().merge_environment_settings(url, {}, stream, verify, cert)
        return {**settings, "proxies": dict(settings["proxies"])}


class UpstreamPool:
    def __init__(self, urls: list[str], *, timeout: float = 600.0, connect_timeout: float = 5.0,
                 retries: int = 3, backoff: float = 0.25, health_interval: float = 15.0):
        if not urls:
            raise ValueError("at least one upstream URL is required")
        self.upstreams = [Upstream(normalise_root(u)) for u in urls]
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self.retries = retries
        self.backoff = backoff
        self.health_interval = health_interval
        self.http = EnvOnceSession()
        adapter = requests.adapters.HTTPAdapter(pool_connections=8, pool_maxsize=1024)  # kept-alive connections reused per upstream (≥ the open streams)
        self.http.mount("http://", adapter)
        self.http.mount("https://", adapter)
        # Generations go through one transport per upstream, chosen here once (transports.py).
        self.lean = http11.Http11Pool(connect_timeout=connect_timeout, timeout=timeout, max_idle=1024)
        lean, plain = LeanTransport(self.lean), RequestsTransport(self.http, connect_timeout, timeout)
        self.transports: dict[str, Transport] = {u.root: transport_for(u.root, lean, plain) for u in self.upstreams}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.on_retry: Callable[[str, GatewayError], None] | None = None  # live metrics (metrics.py)

    # --- choosing -------------------------------------------------------------------------------
    def ranked(self, affinity_key: str) -> list[Upstream]:
        """Upstreams in preference order for this key: healthy first, by rendezvous weight."""
        if len(self.upstreams) == 1:  # one order only: no weights to hash
            return list(self.upstreams)
        return sorted(self.upstreams, key=lambda u: (not u.healthy, -_weight(u.root, affinity_key)))

    # --- generation -----------------------------------------------------------------------------
    def _retrying(self, affinity_key: str, attempt: Callable[[Upstream], T]) -> T:
        """Run `attempt` against the session's upstreams in preference order, with backoff between
        tries, until it returns. `_Retry` moves on to the next try; any other error is final.
        After the last try the most telling error wins: an upstream that answered (5xx, a broken
        stream) says more than one that could not be reached."""
        last: GatewayError | None = None
        answered: GatewayError | None = None
        order = self.ranked(affinity_key)
        for n in range(self.retries + 1):
            if n:
                time.sleep(min(self.backoff * 2 ** (n - 1), 4.0))
            try:
                return attempt(order[n % len(order)])
            except _Retry as retry:
                if self.on_retry is not None and n < self.retries:
                    self.on_retry(order[n % len(order)].root, retry.error)
                last = retry.error
                answered = retry.error if retry.answered else answered
        assert last is not None
        raise answered or last

    def _post(self, up: Upstream, body: dict[str, Any], *, stream: bool = False,
              path: str = CHAT_PATH, headers: dict[str, str] = JSON_HEADERS) -> Reply:
        try:
            return self.transports[up.root].post(up.root, path, fastjson.dumps(body), headers, stream=stream)
        except UpstreamTimeout:
            # Retrying a generation that ran out of time would only double the load.
            raise GatewayError("upstream_timeout",
                               f"upstream {up.root} did not answer within {self.timeout:g} s") from None
        except UpstreamUnreachable as exc:
            up.healthy, up.last_error = False, str(exc)
            raise _Retry(GatewayError("upstream_unavailable", f"upstream {up.root} unreachable: {exc}"),
                         answered=False) from exc

    def chat(self, body: dict[str, Any], affinity_key: str, *, request_id: str | None = None,
             on_attempt: Callable[[str], None] | None = None) -> tuple[ChatResult, str]:
        """One non-streaming chat completion. Retries connection errors and 5xx with backoff,
        moving to the next upstream; 4xx are mapped to client errors without retrying.
        `request_id` goes out as `X-Request-Id`: vLLM then names the request
        `chatcmpl-<request_id>` (`abort_id`), the id `abort` stops it by. `on_attempt(url)` is
        told each upstream tried, before the request goes out."""
        return self.post_json(CHAT_PATH, body, affinity_key, parse_chat_response,
                              request_id=request_id, on_attempt=on_attempt, load=load_chat_answer)

    def post_json(self, path: str, body: dict[str, Any], affinity_key: str,
                  parse: Callable[[dict[str, Any]], T], *, request_id: str | None = None,
                  on_attempt: Callable[[str], None] | None = None,
                  load: Callable[[bytes], Any] = fastjson.loads) -> tuple[T, str]:
        """One non-streaming call to `path` (chat or token-in completions), retried as `chat`."""
        headers = JSON_HEADERS if request_id is None else {**JSON_HEADERS, "X-Request-Id": request_id}

        def attempt(up: Upstream) -> tuple[T, str]:
            if on_attempt is not None:
                on_attempt(up.root)
            resp = self._post(up, body, path=path, headers=headers)
            if resp.status_code >= 500:
                raise _Retry(GatewayError("upstream_error", f"upstream {up.root} answered "
                                          f"{resp.status_code}: {error_message(resp)}"))
            if resp.status_code >= 400:
                raise map_client_error(resp.status_code, error_message(resp))
            try:
                data = load(resp.content)
            except ValueError as exc:
                raise _Retry(GatewayError("upstream_error", f"upstream {up.root} sent invalid JSON: {exc}"),
                             answered=False) from exc
            up.healthy = True
            return parse(data), up.root

        return self._retrying(affinity_key, attempt)

    def can_abort(self, affinity_key: str) -> bool:
        """Whether the upstream this session prefers stops a request by its id (vLLM's
        `POST /abort_requests`, served with VLLM_SERVER_DEV_MODE=1, as the RL API needs)."""
        return self.ranked(affinity_key)[0].abort_by_id is True

    def abort(self, url: str, request_ids: list[str]) -> bool:
        """Ask the upstream at `url` to stop these requests (vLLM's external ids: `abort_id`).
        An id vLLM does not know (not yet admitted, or finished) is ignored there. Never sends
        an empty list: vLLM's RL router aborts every request it holds for that."""
        if not request_ids:
            return False
        try:
            resp = self.http.post(f"{url}{ABORT_PATH}", json={"request_ids": request_ids},
                                  timeout=(self.connect_timeout, ABORT_TIMEOUT))
        except requests.exceptions.RequestException as exc:
            log.warning("abort of %s at %s failed: %s", request_ids, url, exc)
            return False
        if resp.status_code in (404, 405):  # restarted without dev mode: stream plain calls again
            for up in self.upstreams:
                if up.root == url and up.abort_by_id:
                    up.abort_by_id = False
                    log.warning("upstream %s no longer aborts requests by id: plain calls are "
                                "streamed from it again", url)
        return resp.ok

    def can_stream(self, affinity_key: str) -> bool:
        """Whether the upstream this session prefers is known (or not known not) to stream ids."""
        up = self.ranked(affinity_key)[0]
        return up.token_ids is not False and up.stream_token_ids is not False

    def mark_no_stream_ids(self, url: str) -> None:
        for up in self.upstreams:
            if up.root == url and up.stream_token_ids is not False:
                up.stream_token_ids = False
                log.warning("upstream %s streamed without complete token ids: later streams are "
                            "synthesised from non-streaming calls", url)

    def open_stream(self, body: dict[str, Any], affinity_key: str,
                    path: str = CHAT_PATH) -> UpstreamStream:
        """A streaming chat completion, open and past its first chunk. Bounded retries (connection
        errors, 5xx, a stream that ends or breaks before its first chunk) happen here only: once a
        chunk arrived, the caller owns the stream. Raises NoStreamIds when the first chunk lacks
        the prompt token ids that were asked for (the upstream is then marked as not streaming ids)."""
        def attempt(up: Upstream) -> UpstreamStream:
            resp = self._post(up, body, stream=True, path=path)
            if resp.status_code >= 400:
                try:
                    message = error_message(resp)
                finally:
                    resp.close()
                if resp.status_code >= 500:
                    raise _Retry(GatewayError("upstream_error",
                                              f"upstream {up.root} answered {resp.status_code}: {message}"))
                raise map_client_error(resp.status_code, message)
            stream = UpstreamStream(resp, up.root)
            try:
                first = stream.start()
            except GatewayError as exc:
                stream.close()
                if exc.kind == "upstream_timeout":
                    raise
                raise _Retry(exc) from exc
            if first is None:
                stream.close()
                raise _Retry(GatewayError("upstream_error", f"upstream {up.root} ended the stream "
                                          "before its first chunk"))
            error = chunk_error(first)
            if error is not None:
                stream.close()
                code = (first.get("error") or {}).get("code") if isinstance(first.get("error"), dict) else None
                if isinstance(code, int) and 400 <= code < 500:
                    raise map_client_error(code, error)
                raise _Retry(GatewayError("upstream_error", f"upstream {up.root} failed: {error}"))
            up.healthy = True
            if body.get("return_token_ids") and _prompt_ids(first) is None:
                stream.close()
                up.stream_token_ids = False
                raise NoStreamIds(up.root)
            return stream

        return self._retrying(affinity_key, attempt)

    def tokenize(self, messages: list[dict], tools: list[dict] | None, model: str,
                 affinity_key: str) -> int | None:
        """Prompt token count via vLLM's /tokenize; None when no upstream can tell."""
        body: dict[str, Any] = {"model": model, "messages": messages, "add_generation_prompt": True}
        if tools:
            body["tools"] = tools
        for up in self.ranked(affinity_key):
            try:
                resp = self.http.post(f"{up.root}/tokenize", json=body, timeout=(self.connect_timeout, 30))
            except requests.exceptions.RequestException:
                continue
            if resp.ok:
                data = resp.json()
                return int(data.get("count", len(data.get("tokens", []))))
        return None

    # --- health ---------------------------------------------------------------------------------
    def check(self, up: Upstream, model: str | None = None) -> Upstream:
        """Probe one upstream: reachable, its models, and whether it returns token ids."""
        up.last_check = time.time()
        try:
            resp = self.http.get(f"{up.root}/v1/models", timeout=(self.connect_timeout, 10))
            resp.raise_for_status()
            data = resp.json().get("data", [])
            up.models = [m.get("id") for m in data]
            lens = [m.get("max_model_len") for m in data if isinstance(m.get("max_model_len"), int)]
            up.max_model_len = lens[0] if lens else up.max_model_len
            up.healthy, up.last_error = True, None
        except (requests.exceptions.RequestException, ValueError) as exc:
            up.healthy, up.last_error = False, str(exc)
            return up
        if up.token_ids is None and (model or up.models):
            probe: dict[str, Any] = {"model": model or up.models[0], "max_tokens": 1, "logprobs": True,
                                     "return_token_ids": True,
                                     "messages": [{"role": "user", "content": "polar token-id probe polar:notool"}]}
            try:
                resp = self.http.post(f"{up.root}/v1/chat/completions", json=probe,
                                      timeout=(self.connect_timeout, 60))
                result = parse_chat_response(resp.json()) if resp.ok else None
                up.token_ids = bool(result and result.prompt_token_ids and result.completion_token_ids)
            except (requests.exceptions.RequestException, ValueError, GatewayError) as exc:
                up.last_error = f"token-id probe failed: {exc}"
            if up.token_ids:
                up.stream_token_ids = self._probe_stream(up, probe)
                up.abort_by_id = self._probe_abort(up)
                if result is not None:
                    up.token_in = self._probe_token_in(up, probe["model"], list(result.prompt_token_ids or []))
            elif up.token_ids is False:
                up.stream_token_ids = False
            if up.token_ids is False:
                log.error("!" * 78 + "\nUPSTREAM %s DOES NOT RETURN TOKEN IDS (return_token_ids ignored).\n"
                          "Captured calls will have no prompt/completion ids and cannot be trained on.\n"
                          "Use vLLM >= 0.10.2 (or a server that honours return_token_ids).\n" + "!" * 78,
                          up.root)
        return up

    def _probe_token_in(self, up: Upstream, model: str, prompt_ids: list[int]) -> bool | None:
        """Token-in generation: `/v1/completions` with a token-id prompt gives back that very
        prompt and the sampled ids (token-in continuation needs both). None: the probe failed."""
        if not prompt_ids:
            return None
        body = {"model": model, "prompt": prompt_ids, "max_tokens": 1, "return_token_ids": True,
                "logprobs": 0}
        try:
            resp = self.http.post(f"{up.root}{COMPLETIONS_PATH}", json=body,
                                  timeout=(self.connect_timeout, 60))
            if resp.status_code in (404, 405):
                return False
            if not resp.ok:
                return None
            choice = (resp.json().get("choices") or [{}])[0]
        except (requests.exceptions.RequestException, ValueError, AttributeError) as exc:
            up.last_error = f"token-in probe failed: {exc}"
            return None
        return choice.get("prompt_token_ids") == prompt_ids and bool(choice.get("token_ids"))

    def _probe_abort(self, up: Upstream) -> bool | None:
        """Does the upstream abort requests by id? vLLM 0.32 answers `/abort_requests` with 200
        in dev mode (`{"status": "aborted", ...}`) and on `--tokens-only` servers (an empty
        body), else 404. The probe names an id no request has. None: the probe failed (plain
        calls are then streamed, as they were before the probe)."""
        try:
            resp = self.http.post(f"{up.root}{ABORT_PATH}",
                                  json={"request_ids": [f"polar-abort-probe-{uuid.uuid4().hex}"]},
                                  timeout=(self.connect_timeout, ABORT_TIMEOUT))
        except requests.exceptions.RequestException as exc:
            up.last_error = f"abort probe failed: {exc}"
            return None
        if resp.status_code in (404, 405):
            return False
        if not resp.ok:
            return None
        if not resp.content:
            return True
        try:
            data = resp.json()
        except ValueError:
            return None
        return isinstance(data, dict) and data.get("status") == "aborted"

    def _probe_stream(self, up: Upstream, probe: dict[str, Any]) -> bool | None:
        """Does a streamed answer carry the ids (prompt ids first, token ids per chunk, as many as
        the usage says)? None when the probe itself failed (streaming is then still tried)."""
        body = {**probe, "max_tokens": 2, "stream": True, "stream_options": {"include_usage": True}}
        stream = None
        try:
            resp = self.http.post(f"{up.root}/v1/chat/completions", json=body, stream=True,
                                  timeout=(self.connect_timeout, 60))
            if not resp.ok:
                resp.close()
                return None
            stream = UpstreamStream(RequestsReply(resp, 60), up.root)
            stream.start()
            acc = StreamAccumulator()
            for chunk in stream.chunks():
                acc.feed(chunk)
            result = acc.result()
        except (requests.exceptions.RequestException, ValueError, GatewayError) as exc:
            up.last_error = f"streaming token-id probe failed: {exc}"
            return None
        finally:
            if stream is not None:
                stream.close()
        ok = bool(result.prompt_token_ids and result.completion_token_ids and not result.notes)
        if not ok:
            log.warning("upstream %s does not stream token ids: streamed answers will be synthesised "
                        "from non-streaming calls", up.root)
        return ok

    def check_all(self, model: str | None = None) -> list[Upstream]:
        return [self.check(up, model) for up in self.upstreams]

    def served_model(self) -> str | None:
        for up in self.upstreams:
            if not up.models:
                self.check(up)
            if up.models:
                return up.models[0]
        return None

    def max_model_len(self) -> int | None:
        """The served model's context length (the smallest any upstream reports), if known."""
        lens = [up.max_model_len for up in self.upstreams if up.max_model_len]
        return min(lens) if lens else None

    def start_health_thread(self, model: str | None = None) -> None:
        if self._thread:
            return

        def loop() -> None:
            while not self._stop.wait(self.health_interval):
                for up in self.upstreams:
                    self.check(up, model)

        self._thread = threading.Thread(target=loop, name="upstream-health", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self.http.close()
        self.lean.close()

    def describe(self) -> list[dict[str, Any]]:
        return [u.describe() for u in self.upstreams]
