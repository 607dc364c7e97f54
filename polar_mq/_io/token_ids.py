"""Prompt token ids kept as the JSON text they arrived in, made into ints only when asked.

vLLM sends a call's whole prompt as ids in the first chunk of its answer (`prompt_token_ids`), on
every call of an agent session: 29k ids on the recorded Claude Code request. The gateway only
counts them and stores them, and storage cuts them into content-addressed blocks that the previous
call of the session already stored (store/codec.py). Turning the text into Python ints (created and
freed on every call), copying the list and converting it back to bytes to hash its blocks would be
a large share of the gateway's CPU on such a request (figures: docs/benchmarks.md). A
`TokenIds` answers `len` from the text, and the record codec hashes blocks of the text itself; only
blocks it has not seen before are parsed. Anything that wants a list gets one (`to_list`, iteration,
indexing, `==`), parsed once (tests/gateway/test_token_ids.py).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, overload

import numpy as np
import orjson

_COMMA, _ZERO = ord(","), ord("0")
_DIGITS_AND_COMMA = b"0123456789,"
NUMPY_FROM = 8192  # bytes of id text (~1,300 ids) from which the numpy passes are the faster
_WHITESPACE = b" \t\r\n"


class TokenIds(Sequence[int]):
    """Non-negative integer ids as the compact text between a JSON array's brackets (`1,2,3`).
    Immutable; equal to any list or tuple of the same ints."""

    __slots__ = ("text", "_list", "_len")

    def __init__(self, text: bytes, count: int):
        self.text = text
        self._len = count
        self._list: list[int] | None = None

    @classmethod
    def from_array_text(cls, text: bytes) -> TokenIds | None:
        """The ids of `text` (what is between `[` and `]`) written compactly, as vLLM writes them
        (`1,2,3`), or None for anything else (a sign, a fraction, whitespace, an empty element):
        the caller parses that the ordinary way. Checked in numpy's vector passes over the bytes
        (an order of magnitude faster than the stdlib's translate and big-int passes on a large
        prompt): only digits and commas, no comma at either end or next to another, the count
        from the commas. Below NUMPY_FROM bytes the same checks are the stdlib's: numpy's fixed
        cost per call (higher still in the gateway, where its code runs cold) is more than they
        take there."""
        if not text:
            return cls(b"", 0)
        if len(text) < NUMPY_FROM:
            if text.translate(None, _DIGITS_AND_COMMA):
                return None
            if text[:1] == b"," or text[-1:] == b"," or b",," in text:
                return None
            return cls(text, text.count(b",") + 1)
        raw = np.frombuffer(text, np.uint8)
        comma = raw == _COMMA
        if not (((raw - _ZERO) <= 9) | comma).all():  # uint8: a byte below "0" wraps past 9
            return None
        if comma[0] or comma[-1] or (comma[1:] & comma[:-1]).any():
            return None
        return cls(text, int(np.count_nonzero(comma)) + 1)

    def __len__(self) -> int:
        return self._len

    def to_list(self) -> list[int]:
        if self._list is None:
            self._list = parse_ids(self.text)
        return self._list

    @overload
    def __getitem__(self, index: int) -> int: ...

    @overload
    def __getitem__(self, index: slice) -> list[int]: ...

    def __getitem__(self, index: int | slice) -> int | list[int]:
        return self.to_list()[index]

    def __iter__(self) -> Iterator[int]:
        return iter(self.to_list())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, TokenIds):
            return self.text == other.text or self.to_list() == other.to_list()
        if isinstance(other, (list, tuple)):
            return len(other) == self._len and self.to_list() == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # equal to lists, which are not hashable

    def __repr__(self) -> str:
        return f"TokenIds({self._len} ids)"

    def spans(self, min_bytes: int) -> tuple[list[tuple[int, int]], int]:
        """The text cut at the first comma at or after every `min_bytes` (a cut depends only on
        the text before it, so two prompts that share a prefix share their leading pieces):
        ([(start, end) of each whole piece], where the last, shorter piece starts)."""
        text = self.text
        spans: list[tuple[int, int]] = []
        pos = 0
        find = text.find
        while True:
            cut = find(b",", pos + min_bytes)
            if cut < 0:
                return spans, pos
            spans.append((pos, cut))
            pos = cut + 1


def parse_ids(text: bytes) -> list[int]:
    """The ints of a JSON array's inner text."""
    if not text.strip(_WHITESPACE):
        return []
    try:
        value: Any = orjson.loads(b"[" + text + b"]")
    except orjson.JSONDecodeError:  # e.g. a leading zero, which int() reads as the number it is
        return [int(part) for part in text.split(b",")]
    return list(value)


def as_ids(value: Any) -> Sequence[int]:
    """A stream chunk's `prompt_token_ids` as the record keeps it: a TokenIds as it is (immutable),
    anything else copied into a list."""
    return value if isinstance(value, TokenIds) else list(value)


def plain(value: Any) -> Any:
    """`value` with a TokenIds made a list (for msgpack, JSON and anything else that wants plain
    data); other values as they are."""
    return value.to_list() if isinstance(value, TokenIds) else value
