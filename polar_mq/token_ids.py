"""Prompt token ids kept as the JSON text they arrived in, made into ints only when asked.

vLLM sends a call's whole prompt as ids in the first chunk of its answer (`prompt_token_ids`), on
every call of an agent session: 29k ids on the recorded Claude Code request. The gateway only
counts them and stores them, and storage cuts them into content-addressed blocks that the previous
call of the session already stored (record_codec.py). Turning the text into 29k Python ints (0.64 ms
in orjson, created and freed on every call), copying the list and converting it back to bytes to
hash its blocks (0.4–0.75 ms) was a third of the gateway's CPU on that request (py-spy --gil). A
`TokenIds` answers `len` from the text, and the record codec hashes blocks of the text itself; only
blocks it has not seen before are parsed. Anything that wants a list gets one (`to_list`, iteration,
indexing, `==`), parsed once.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, overload

import orjson

_COMMA_BIT = bytes.maketrans(b",0123456789", b"\x01" + b"\x00" * 10)  # a comma: 1, a digit: 0
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
        the caller parses that the ordinary way. Checked with C-level passes only (~0.2 ms on
        118 KB): the characters, no comma at either end, no two commas together (a big-int AND
        of the comma map with itself shifted by one byte), and the count from the commas."""
        if not text:
            return cls(b"", 0)
        if text.translate(None, b"0123456789,") or text[:1] == b"," or text[-1:] == b",":
            return None
        commas = int.from_bytes(text.translate(_COMMA_BIT), "little")
        if commas & (commas >> 8):
            return None
        return cls(text, commas.bit_count() + 1)

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

    def pieces(self, min_bytes: int) -> Iterator[tuple[bytes, bool]]:
        """The text cut at the first comma at or after every `min_bytes` (a cut depends only on
        the text before it, so two prompts that share a prefix share their leading pieces);
        yields (piece, whether it is a whole piece: the last one may be shorter)."""
        text = self.text
        pos = 0
        n = len(text)
        while pos < n:
            cut = text.find(b",", pos + min_bytes)
            if cut < 0:
                yield text[pos:], False
                return
            yield text[pos:cut], True
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
