"""The reasoning round-trip token: the model's reasoning, carried by the client and handed back.

Every provider API has an opaque field the client must echo on the next turn: Anthropic's
thinking `signature`, the Responses API's reasoning `encrypted_content`, Gemini's
`thoughtSignature`. The gateway puts the reasoning text itself there, so that the history it sends
upstream holds exactly what the model produced, even when a client trims, rewrites or drops the
visible reasoning. One token format serves all three:

    "polarmq1" + base64(zlib(utf-8 reasoning))      (standard alphabet, padded)

The prefix is eight base64 characters, so the whole token is valid base64: google-genai (Python)
decodes a thoughtSignature as base64 bytes and re-encodes them with the URL-safe alphabet, which
leaves the prefix as it is; `decode_reasoning` accepts either alphabet, with or without padding.

`decode_reasoning` also reads the three forms earlier gateways issued, so captured sessions and recorded
client requests still round-trip: "polar1." + urlsafe-base64(zlib(text)) (Anthropic),
"polar.r1." + urlsafe-base64(JSON {"reasoning": text}) (Responses) and
base64(b"pmq1:" + zlib(JSON {"r": text})) (Gemini). Anything else — OpenAI's or Google's own
tokens, Gemini CLI's "skip_thought_signature_validator", corrupt data — decodes to None.

Tests: tests/adapters/test_adapter_kit.py, tests/adapters/test_anthropic.py, tests/adapters/test_gemini.py.
"""

from __future__ import annotations

import base64
import binascii
import json
import zlib
from typing import Any

PREFIX = "polarmq1"

# Forms issued before the one format (decoded, never written).
LEGACY_ANTHROPIC_PREFIX = "polar1."
LEGACY_RESPONSES_PREFIX = "polar.r1."
LEGACY_GEMINI_MAGIC = b"pmq1:"


def encode_reasoning(reasoning: str) -> str:
    """The token that carries `reasoning` through a client and back to us."""
    packed = zlib.compress(reasoning.encode("utf-8"), 9)
    return PREFIX + base64.b64encode(packed).decode("ascii")


def decode_reasoning(token: Any) -> str | None:
    """The reasoning inside a token this gateway issued (any of its forms); None otherwise."""
    if not isinstance(token, str) or not token:
        return None
    if token.startswith(LEGACY_ANTHROPIC_PREFIX):
        return _inflate(_b64(token[len(LEGACY_ANTHROPIC_PREFIX):]))
    if token.startswith(LEGACY_RESPONSES_PREFIX):
        return _field(_b64(token[len(LEGACY_RESPONSES_PREFIX):]), "reasoning")
    if token.startswith(PREFIX):
        return _inflate(_b64(token[len(PREFIX):]))
    raw = _b64(token)
    if raw is not None and raw.startswith(LEGACY_GEMINI_MAGIC):
        text = _inflate(raw[len(LEGACY_GEMINI_MAGIC):])
        return _field(text.encode("utf-8"), "r") if text is not None else None
    return None


def _b64(text: str) -> bytes | None:
    """Bytes of standard or URL-safe base64, padding optional; None when it is not base64."""
    text = text.strip().replace("-", "+").replace("_", "/")
    text += "=" * (-len(text) % 4)
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return None


def _inflate(raw: bytes | None) -> str | None:
    if raw is None:
        return None
    try:
        return zlib.decompress(raw).decode("utf-8")
    except (zlib.error, UnicodeDecodeError):
        return None


def _field(raw: bytes | None, name: str) -> str | None:
    """`name` of a JSON object, when it is a string."""
    if raw is None:
        return None
    try:
        data = json.loads(raw)
    except ValueError:
        return None
    value = data.get(name) if isinstance(data, dict) else None
    return value if isinstance(value, str) else None
