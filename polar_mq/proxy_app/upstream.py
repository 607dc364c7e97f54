"""The vLLM upstream(s): session affinity, health checks, bounded retries, error mapping.

Every generation goes to vLLM's OpenAI chat endpoint with `return_token_ids` and `logprobs` so the
capture record carries the exact sampled ids. A session sticks to one upstream (rendezvous hash on
the session id) so its prefix stays in that server's KV cache; an unhealthy upstream is skipped.
"""

from __future__ import annotations

import hashlib
import logging
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import requests

from .adapters.base import ChatResult, GatewayError

log = logging.getLogger("polar_mq.upstream")

_MAX_LEN_RE = re.compile(r"maximum context length is (\d+)")
# vLLM has worded the prompt size several ways across versions.
_PROMPT_LEN_RES = [re.compile(p) for p in (r"(\d+) input tokens", r"resulted in (\d+) tokens",
                                           r"requested (\d+) tokens", r"prompt \(length (\d+)\)")]
_CONTEXT_WORDS = ("maximum context length", "context length", "too long", "exceeds the max")


def normalise_root(url: str) -> str:
    """Server root from `http://h:p`, `http://h:p/` or `http://h:p/v1`."""
    url = url.rstrip("/")
    return url[:-3] if url.endswith("/v1") else url


@dataclass
class Upstream:
    root: str
    healthy: bool = True
    token_ids: bool | None = None  # does it really return prompt/completion token ids?
    last_error: str | None = None
    last_check: float = 0.0
    models: list[str] = field(default_factory=list)

    def describe(self) -> dict[str, Any]:
        return {"url": self.root, "healthy": self.healthy, "token_ids": self.token_ids,
                "models": self.models, "last_error": self.last_error}


def _weight(root: str, key: str) -> int:
    return int.from_bytes(hashlib.blake2b(f"{root}|{key}".encode(), digest_size=8).digest(), "big")


def parse_chat_response(data: dict[str, Any]) -> ChatResult:
    """vLLM chat completion JSON → ChatResult (token ids and logprobs pulled out)."""
    try:
        choice = data["choices"][0]
        message = dict(choice.get("message") or {})
    except (KeyError, IndexError, TypeError) as exc:
        raise GatewayError("upstream_error", f"upstream answer has no choices: {exc}") from exc
    if "reasoning_content" in message and not message.get("reasoning"):
        message["reasoning"] = message.pop("reasoning_content")
    message.pop("reasoning_content", None)
    logprobs = None
    content = (choice.get("logprobs") or {}).get("content")
    if content is not None:
        logprobs = [float(entry.get("logprob", 0.0)) for entry in content]
    usage = data.get("usage") or {}
    prompt_ids = data.get("prompt_token_ids")
    completion_ids = choice.get("token_ids")
    return ChatResult(
        id=data.get("id") or "chatcmpl-unknown",
        model=data.get("model") or "",
        message=message,
        finish_reason=choice.get("finish_reason") or "stop",
        prompt_token_ids=list(prompt_ids) if prompt_ids is not None else None,
        completion_token_ids=list(completion_ids) if completion_ids is not None else None,
        logprobs=logprobs,
        prompt_tokens=int(usage.get("prompt_tokens") or len(prompt_ids or [])),
        completion_tokens=int(usage.get("completion_tokens") or len(completion_ids or [])),
        created=int(data.get("created") or time.time()),
        raw=data,
    )


def error_message(resp: requests.Response) -> str:
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


def map_client_error(status: int, message: str) -> GatewayError:
    """A 4xx from the upstream as the gateway error the client should see."""
    lowered = message.lower()
    if any(word in lowered for word in _CONTEXT_WORDS):
        detail: dict[str, Any] = {}
        m = _MAX_LEN_RE.search(message)
        if m:
            detail["max_model_len"] = int(m.group(1))
        for regex in _PROMPT_LEN_RES:
            m = regex.search(message)
            if m:
                detail["prompt_tokens"] = int(m.group(1))
                break
        return GatewayError("context_length", message, detail=detail)
    if status == 404:
        return GatewayError("not_found", f"upstream: {message}")
    if status == 429:
        return GatewayError("rate_limit", f"upstream: {message}")
    return GatewayError("invalid_request", f"upstream rejected the request: {message}", status=400)


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
        self.http = requests.Session()
        adapter = requests.adapters.HTTPAdapter(pool_connections=8, pool_maxsize=128)
        self.http.mount("http://", adapter)
        self.http.mount("https://", adapter)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # --- choosing -------------------------------------------------------------------------------
    def ranked(self, affinity_key: str) -> list[Upstream]:
        """Upstreams in preference order for this key: healthy first, by rendezvous weight."""
        return sorted(self.upstreams, key=lambda u: (not u.healthy, -_weight(u.root, affinity_key)))

    # --- generation -----------------------------------------------------------------------------
    def chat(self, body: dict[str, Any], affinity_key: str) -> tuple[ChatResult, str]:
        """One non-streaming chat completion. Retries connection errors and 5xx with backoff,
        moving to the next upstream; 4xx are mapped to client errors without retrying."""
        last: GatewayError | None = None
        answered: GatewayError | None = None  # an upstream that answered 5xx says more than a dead one
        order = self.ranked(affinity_key)
        for attempt in range(self.retries + 1):
            up = order[attempt % len(order)]
            if attempt:
                time.sleep(min(self.backoff * 2 ** (attempt - 1), 4.0))
            try:
                resp = self.http.post(f"{up.root}/v1/chat/completions", json=body,
                                      timeout=(self.connect_timeout, self.timeout))
            except requests.exceptions.ReadTimeout:
                # Retrying a generation that ran out of time would only double the load.
                raise GatewayError("upstream_timeout",
                                   f"upstream {up.root} did not answer within {self.timeout:g} s")
            except requests.exceptions.RequestException as exc:
                up.healthy, up.last_error = False, str(exc)
                last = GatewayError("upstream_unavailable", f"upstream {up.root} unreachable: {exc}")
                continue
            if resp.status_code >= 500:
                last = answered = GatewayError("upstream_error",
                                    f"upstream {up.root} answered {resp.status_code}: {error_message(resp)}")
                continue
            if resp.status_code >= 400:
                raise map_client_error(resp.status_code, error_message(resp))
            try:
                data = resp.json()
            except ValueError as exc:
                last = GatewayError("upstream_error", f"upstream {up.root} sent invalid JSON: {exc}")
                continue
            up.healthy = True
            return parse_chat_response(data), up.root
        assert last is not None
        raise answered or last

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
            up.models = [m.get("id") for m in resp.json().get("data", [])]
            up.healthy, up.last_error = True, None
        except (requests.exceptions.RequestException, ValueError) as exc:
            up.healthy, up.last_error = False, str(exc)
            return up
        if up.token_ids is None and (model or up.models):
            probe = {"model": model or up.models[0], "max_tokens": 1, "logprobs": True,
                     "return_token_ids": True,
                     "messages": [{"role": "user", "content": "polar token-id probe polar:notool"}]}
            try:
                resp = self.http.post(f"{up.root}/v1/chat/completions", json=probe,
                                      timeout=(self.connect_timeout, 60))
                result = parse_chat_response(resp.json()) if resp.ok else None
                up.token_ids = bool(result and result.prompt_token_ids and result.completion_token_ids)
            except (requests.exceptions.RequestException, ValueError, GatewayError) as exc:
                up.last_error = f"token-id probe failed: {exc}"
            if up.token_ids is False:
                log.error("!" * 78 + "\nUPSTREAM %s DOES NOT RETURN TOKEN IDS (return_token_ids ignored).\n"
                          "Captured calls will have no prompt/completion ids and cannot be trained on.\n"
                          "Use vLLM >= 0.10.2 (or a server that honours return_token_ids).\n" + "!" * 78,
                          up.root)
        return up

    def check_all(self, model: str | None = None) -> list[Upstream]:
        return [self.check(up, model) for up in self.upstreams]

    def served_model(self) -> str | None:
        for up in self.upstreams:
            if not up.models:
                self.check(up)
            if up.models:
                return up.models[0]
        return None

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

    def describe(self) -> list[dict[str, Any]]:
        return [u.describe() for u in self.upstreams]
