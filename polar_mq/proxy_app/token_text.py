"""Token text for viewers: the text of single token ids, so a UI can show every recorded id.

The gateway is the one part that knows the upstream and its tokenizer, so it answers
`POST /tokens/text {"ids": [...]}` with `{"model", "texts": {"<id>": text}}`. Each unique id is
detokenised alone with the upstream's `/detokenize` (vLLM's endpoint; the stand-in has it too), a
few at a time, and cached in Redis per served model: the map of an id to its text never changes
for a model, so every gateway and every later page shares the work. A byte-level token that is
only part of a UTF-8 character comes back as U+FFFD, as vLLM decodes it alone.

Tests: tests/gateway/test_metrics_live.py.
"""

from __future__ import annotations

import hmac
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Iterable

import redis
import requests
from redis.typing import EncodableT
from flask import Flask, Response, jsonify, request

from polar_mq.store import replies

if TYPE_CHECKING:
    from polar_mq.proxy_app.core import Gateway

log = logging.getLogger("polar_mq.token_text")

MAX_IDS = 200_000  # one request; a long session has a few thousand unique ids
PARALLEL = 8


class DetokenizeError(Exception):
    """No upstream could detokenise (unreachable, or it has no /detokenize)."""


class TokenTexts:
    """id → text for the served model: Redis first, then the upstream's /detokenize."""

    def __init__(self, gw: "Gateway"):
        self.gw = gw
        self._pool = ThreadPoolExecutor(max_workers=PARALLEL, thread_name_prefix="detokenize")

    def _cache_key(self, model: str) -> str:
        return self.gw.store.keys.token_text(model)

    def _detokenize_one(self, model: str, token_id: int) -> str | None:
        """Text of one id; None when the upstream rejects the id (out of its vocabulary)."""
        pool = self.gw.pool
        last = "no upstream"
        for up in pool.ranked("detokenize"):
            try:
                resp = pool.http.post(f"{up.root}/detokenize", json={"model": model, "tokens": [token_id]},
                                      timeout=(pool.connect_timeout, 30))
            except requests.exceptions.RequestException as exc:
                last = f"{up.root}: {exc}"
                continue
            if resp.ok:
                try:
                    return str(resp.json()["prompt"])
                except (ValueError, KeyError, TypeError) as exc:
                    last = f"{up.root}: unexpected /detokenize answer: {exc}"
                    continue
            if resp.status_code in (400, 422):
                return None  # the id is not in this model's vocabulary
            last = f"{up.root}: HTTP {resp.status_code}"
        raise DetokenizeError(f"cannot detokenise with any upstream ({last})")

    def texts(self, ids: Iterable[int]) -> tuple[str, dict[int, str | None]]:
        model = self.gw.served_model
        wanted = sorted(set(ids))
        out: dict[int, str | None] = {}
        r = self.gw.store.r
        key = self._cache_key(model)
        try:
            cached = [replies.blob(b) for b in r.hmget(key, [str(i) for i in wanted])] if wanted else []
        except redis.RedisError:
            cached = [None] * len(wanted)
        missing = []
        for token_id, blob in zip(wanted, cached):
            if blob is None:
                missing.append(token_id)
            else:
                out[token_id] = blob.decode("utf-8", errors="replace")
        if missing:
            found = list(self._pool.map(lambda i: self._detokenize_one(model, i), missing))
            fresh: dict[EncodableT, EncodableT] = {str(i): t for i, t in zip(missing, found) if t is not None}
            out.update(zip(missing, found))
            if fresh:
                try:
                    r.hset(key, mapping=fresh)
                except redis.RedisError:  # a cache write failure only costs time next page
                    log.warning("could not cache token texts", exc_info=True)
        return model, out


def _problem(status: int, title: str, detail: str) -> Response:
    resp = jsonify({"type": "about:blank", "title": title, "status": status, "detail": detail})
    resp.status_code = status
    resp.content_type = "application/problem+json"
    return resp


def _parse_ids(body: Any) -> list[int] | str:
    if not isinstance(body, dict) or not isinstance(body.get("ids"), list):
        return "body must be a JSON object with 'ids': a list of token ids"
    ids = body["ids"]
    if len(ids) > MAX_IDS:
        return f"'ids' has {len(ids)} entries; at most {MAX_IDS}"
    if not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
        return "'ids' must hold non-negative integers"
    return ids


def register(app: Flask, gw: "Gateway") -> None:
    texts = TokenTexts(gw)
    app.extensions["polar_token_texts"] = texts

    @app.post("/tokens/text")
    def token_text() -> Response:
        token = gw.settings.admin_token
        auth = request.headers.get("Authorization", "")
        if token and not (auth.lower().startswith("bearer ") and hmac.compare_digest(auth[7:].strip(), token)):
            return _problem(401, "Unauthorized", "a valid bearer token is required")
        ids = _parse_ids(request.get_json(silent=True))
        if isinstance(ids, str):
            return _problem(400, "Bad Request", ids)
        try:
            model, found = texts.texts(ids)
        except DetokenizeError as exc:
            return _problem(503, "Service Unavailable", str(exc))
        except Exception as exc:  # e.g. no served model known yet
            return _problem(503, "Service Unavailable", f"token texts unavailable: {exc}")
        return jsonify({"model": model, "texts": {str(i): t for i, t in found.items()}})
