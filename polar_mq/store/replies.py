"""Typed Redis replies: what our clients really get back.

redis-py annotates each reply for every client mode at once (`bytes | str`, and for async
clients awaitables too) because `decode_responses` is a per-client setting the type checker
cannot see. No client here sets it (store.connect and the gateway's redis_client make them all),
so every reply is bytes. These helpers narrow a reply once, where it is read, and raise if a
decoding client ever slips in instead of handing a `str` to code that expects bytes.

Tests: tests/pipeline/test_shape.py.
"""

from __future__ import annotations

from typing import Any, Iterable


def blob(reply: Any) -> bytes | None:
    """A bulk reply (GET, HGET, LPOP...): bytes, or None for a missing key."""
    if reply is None or isinstance(reply, bytes):
        return reply
    raise TypeError(f"expected a bytes reply (a client without decode_responses), got {type(reply).__name__}")


def text(reply: Any) -> str | None:
    """A bulk reply holding UTF-8 text (ids, keys, JSON), decoded; None for a missing key."""
    data = blob(reply)
    return data.decode() if data is not None else None


def texts(reply: Iterable[Any], errors: str = "strict") -> list[str]:
    """A multi-bulk reply of names (LRANGE, SMEMBERS, ZRANGE, SCAN members), decoded."""
    return [_bytes(item).decode(errors=errors) for item in reply]


def text_map(reply: Any) -> dict[str, bytes]:
    """HGETALL: field names decoded, values as stored."""
    return {_text(k): _bytes(v) for k, v in dict(reply).items()}


def scored(reply: Iterable[Any]) -> list[tuple[str, float]]:
    """ZRANGE ... WITHSCORES: (member, score) pairs, members decoded."""
    return [(_text(member), float(score)) for member, score in reply]


def _bytes(reply: Any) -> bytes:
    data = blob(reply)
    if data is None:
        raise TypeError("expected a bytes reply, got nil")
    return data


def _text(reply: Any) -> str:
    return _bytes(reply).decode()
