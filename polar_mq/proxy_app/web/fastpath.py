"""Every provider call (the endpoints of routes.py: Anthropic Messages, OpenAI Chat and
Responses, Gemini, their token counts) as a plain WSGI layer in front of the Flask app, which
keeps everything else (sessions API, health, metrics, token text, model lists).

Why a layer of its own: the provider calls need none of Flask's per-request machinery (request
context, URL map, hooks, Response objects, the stdlib JSON encoder), and they are the gateway's
hot path (bench/bench_gateway.py). One decoder for all of them: the key from the /s/<key> prefix
or the SDK's header, the body (sized or chunked, capped at the gateway limit), the client's retry
count; errors in the provider's shape, an unexpected exception logged and answered in it too;
replies serialised with orjson (compact UTF-8 JSON, key order kept).

Tests: tests/gateway/test_gateway_inprocess.py, tests/gateway/test_deferred_store.py,
tests/gateway/test_early_admission.py.
"""

from __future__ import annotations

import logging
from http import HTTPStatus
from typing import Any, Callable, Iterable, Iterator
from urllib.parse import parse_qsl

from polar_mq.auth import redact
from polar_mq._io import jsonsafe
from polar_mq.proxy_app import fastjson
from polar_mq.proxy_app.adapters.base import GatewayError
from polar_mq.proxy_app.calls import client_socket
from polar_mq.proxy_app.core import CallContext, Gateway, JsonReply, StreamReply, adapter, error_reply
from polar_mq.proxy_app.web.routes import ProviderRoute, provider_route

log = logging.getLogger("polar_mq.gateway")

_STATUS_LINES: dict[int, str] = {}


def _status(code: int) -> str:
    line = _STATUS_LINES.get(code)
    if line is None:  # HTTPStatus(code) builds an enum lookup per reply: once per code instead
        try:
            line = f"{code} {HTTPStatus(code).phrase}"
        except ValueError:
            line = f"{code} UNKNOWN"
        if len(_STATUS_LINES) < 1000:
            _STATUS_LINES[code] = line
    return line


def _int(value: str | None) -> int:
    try:
        return int(value) if value else 0
    except ValueError:
        return 0


class ThenStore:
    """A plain reply's body, and the storing of its record to complete once the server has
    written it: the WSGI server calls `close()` after the body (and when writing it failed).
    Why: the record's MULTI is sent before the reply; its answer is read while the client
    already reads its own, so a call's latency does not include that Redis round trip.
    The next request on the connection is read only after `close()`, so a client's next call
    finds its previous record stored (TITO reads it; tests/gateway/test_deferred_store.py)."""


    __slots__ = ("data", "_after")

    def __init__(self, data: bytes, after: Callable[[], None]):
        self.data = data
        self._after: Callable[[], None] | None = after

    def __iter__(self) -> Iterator[bytes]:
        return iter((self.data,))

    def close(self) -> None:
        after, self._after = self._after, None
        if after is not None:
            after()


# WSGI environ key: the request body is already in memory (the lean worker read it whole).
BODY_IN_MEMORY = "polar.body_in_memory"


class FastPath:
    """WSGI middleware: provider calls here, everything else to `app` (Flask's wsgi_app)."""

    def __init__(self, app: Callable, gw: Gateway, max_body_bytes: int):
        self.app = app
        self.gw = gw
        self.max_body_bytes = max_body_bytes

    def route(self, environ: dict[str, Any]) -> ProviderRoute | None:
        """The provider call this request is, else None (then it is the Flask app's)."""
        if environ.get("REQUEST_METHOD") != "POST":
            return None
        return provider_route(environ.get("PATH_INFO", ""))

    def __call__(self, environ: dict[str, Any], start_response: Callable) -> Iterable[bytes]:
        routed = self.route(environ)
        if routed is None:
            return self.app(environ, start_response)
        mod = adapter(routed.provider)
        try:
            try:
                reply = self.call(environ, routed)
            except GatewayError as err:
                reply = error_reply(mod, err)
        except Exception as exc:  # as app.py's errorhandler(Exception)
            path = environ.get("PATH_INFO", "")
            log.exception("unhandled error on %s", redact(path))
            reply = error_reply(mod, GatewayError(
                "internal", f"gateway internal error: {type(exc).__name__}: {redact(str(exc))}"))
        if isinstance(reply, StreamReply):
            start_response("200 OK", [("Content-Type", reply.content_type), *reply.headers.items()])
            return reply.frames
        try:
            data = jsonsafe.dumps(reply.body)
            start_response(_status(reply.status), [("Content-Type", "application/json"),
                                                   ("Content-Length", str(len(data))), *reply.headers.items()])
        except BaseException:
            if reply.after is not None:
                reply.after()
            raise
        if reply.after is not None:
            return ThenStore(data, reply.after)
        return [data]

    def call(self, environ: dict[str, Any], route: ProviderRoute) -> JsonReply | StreamReply:
        gw = self.gw
        provider = route.provider
        session_key = route.key or self.header_key(environ)
        sid, cached = gw.resolve(session_key)
        if route.unknown is not None:
            raise GatewayError("not_found", f"unknown Gemini method {route.unknown!r}; expected "
                               f"<model>:generateContent, :streamGenerateContent or :countTokens")
        if route.count:
            return gw.count_tokens(provider, sid, self.read_json(environ))
        # The admission script goes out before the body is parsed and converted; its answer is
        # read after (core.Gateway.enter), so Redis works while this process does. A body still
        # to come off the socket (not the lean worker's) is read first: a slow upload must not
        # hold one of the gateway's Redis connections.
        buffered = environ.get(BODY_IN_MEMORY, False)
        body = None if buffered else self.read_json(environ)
        entry = gw.admit_early(sid, session_key if cached else None, provider)
        try:
            if body is None:
                body = self.read_json(environ)
            context = CallContext(retry_count=_int(environ.get("HTTP_X_STAINLESS_RETRY_COUNT")),
                                  client_socket=client_socket(environ),
                                  cached_key=session_key if cached else None, defer_store=True, entry=entry)
        except BaseException:
            gw.withdraw(entry)
            raise
        if route.model is not None:  # Gemini: the model and the method come from the path
            alt = dict(parse_qsl(environ.get("QUERY_STRING") or "")).get("alt", "json")
            return gw.generate(provider, sid, {"model": route.model, **body}, model=route.model,
                               stream=route.stream, extra={"alt": alt}, context=context)
        return gw.generate(provider, sid, body, context=context)

    @staticmethod
    def header_key(environ: dict[str, Any]) -> str | None:
        """app.request_key without a URL key: the SDK's API-key header, bearer token or ?key=."""
        for name in ("HTTP_X_API_KEY", "HTTP_X_GOOG_API_KEY"):
            if environ.get(name):
                return environ[name]
        auth = environ.get("HTTP_AUTHORIZATION", "")
        if auth.lower().startswith("bearer "):
            return auth[7:].strip()
        query = environ.get("QUERY_STRING")
        if query:
            for name, value in parse_qsl(query, keep_blank_values=True):
                if name == "key":
                    return value
        return None

    def read_json(self, environ: dict[str, Any]) -> dict[str, Any]:
        """The request's JSON object: a sized body read whole, a chunked one up to the limit."""
        max_bytes = self.max_body_bytes
        sized = environ.get("CONTENT_LENGTH")
        if sized:
            try:
                length = int(sized)
            except ValueError:
                length = 0
            if length > max_bytes:
                raise GatewayError("too_large", f"request body of {length} bytes exceeds "
                                   f"the gateway limit of {max_bytes} bytes")
            data = environ["wsgi.input"].read(length) if length > 0 else b""
        else:  # chunked (or no body): the server decodes the framing
            data = environ["wsgi.input"].read(max_bytes + 1)
            if len(data) > max_bytes:
                raise GatewayError("too_large", f"request body exceeds the gateway limit of {max_bytes} bytes")
        return fastjson.request_object(data)
