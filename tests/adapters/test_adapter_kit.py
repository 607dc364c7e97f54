"""The adapter kit: one reasoning token for every provider (old forms still read), one OpenAI
error object, the registry keyed by model.PROVIDERS and the Adapter protocol with its defaults.

Pure logic, no servers (a few seconds, most of it importing google-genai).
"""

from __future__ import annotations

import base64
import json
import zlib
from pathlib import Path
from typing import Any, Iterator

import pytest
from google.genai import types

from polar_mq.model import PROVIDERS
from polar_mq.proxy_app.adapters import anthropic, base, gemini, openai_chat, openai_responses, openai_errors
from polar_mq.proxy_app.adapters.base import ChatRequest, ChatResult, GatewayError
from polar_mq.proxy_app.adapters.reasoning import PREFIX, decode_reasoning, encode_reasoning
from polar_mq.proxy_app.adapters.registry import ADAPTERS, adapter

REPLAYS = Path(__file__).resolve().parents[1] / "replays"
TEXT = "Let me think… ünïcode, \"quotes\", newlines\n\nand a long tail " + "x" * 500

# The three forms earlier gateways wrote, built here from their description (reasoning.py).
LEGACY = {
    "anthropic": "polar1." + base64.urlsafe_b64encode(zlib.compress(TEXT.encode(), 9)).decode(),
    "openai_responses": "polar.r1." + base64.urlsafe_b64encode(
        json.dumps({"reasoning": TEXT}, ensure_ascii=False).encode()).decode(),
    "gemini": base64.b64encode(b"pmq1:" + zlib.compress(json.dumps({"r": TEXT}).encode())).decode(),
}


def test_one_token_round_trips_and_is_base64_for_gemini() -> None:
    token = encode_reasoning(TEXT)
    assert token.startswith(PREFIX) and decode_reasoning(token) == TEXT
    base64.b64decode(token, validate=True)  # the whole token is base64 (Gemini's bytes field)
    # google-genai decodes thoughtSignature to bytes and dumps it URL-safe: still ours.
    part = types.Part.model_validate({"text": "x", "thoughtSignature": token})
    dumped = part.model_dump(mode="json", by_alias=True, exclude_none=True)["thoughtSignature"]
    assert decode_reasoning(dumped) == TEXT
    assert decode_reasoning(dumped.rstrip("=")) == TEXT
    assert decode_reasoning(encode_reasoning("")) == ""


@pytest.mark.parametrize("form", sorted(LEGACY))
def test_legacy_forms_still_decode(form: str) -> None:
    assert decode_reasoning(LEGACY[form]) == TEXT


@pytest.mark.parametrize("token", [
    None, 12, "", "EqQBCkgIARABGAIiQL", "gAAAAB-openai-token", "skip_thought_signature_validator",
    base64.b64encode(b"google-opaque").decode(), PREFIX + "!!!", PREFIX + base64.b64encode(b"no zlib").decode(),
    "polar1.!!", "polar.r1." + base64.urlsafe_b64encode(b"[1]").decode(),
])
def test_foreign_or_corrupt_tokens_are_none(token: Any) -> None:
    assert decode_reasoning(token) is None


def _tokens(node: Any) -> Iterator[str]:
    """Every reasoning token a recorded request carries (signature / encrypted_content /
    thoughtSignature), wherever it sits."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("signature", "encrypted_content", "thoughtSignature") and isinstance(value, str):
                yield value
            else:
                yield from _tokens(value)
    elif isinstance(node, list):
        for value in node:
            yield from _tokens(value)


def test_tokens_in_recorded_sessions_still_decode() -> None:
    """Real requests recorded from the CLIs carry the old forms; each one of ours still reads."""
    ours = [t for path in REPLAYS.glob("*/*.json") for t in _tokens(json.loads(path.read_text()))
            if t.startswith(("polar1.", "polar.r1.", "cG1xMTp4"))]
    assert {t[:7] for t in ours} >= {"polar1.", "polar.r", "cG1xMTp"}
    assert all(isinstance(decode_reasoning(t), str) and decode_reasoning(t) for t in ours)


def test_every_adapter_issues_the_one_token() -> None:
    result = ChatResult(id="r1", model="m", message={"content": "ok", "reasoning": TEXT}, finish_reason="stop")
    signature = anthropic.from_chat(result, anthropic.to_chat(
        {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}))["content"][0]["signature"]
    encrypted = openai_responses.from_chat(result, openai_responses.to_chat(
        {"model": "m", "input": "hi"}))["output"][0]["encrypted_content"]
    thought = gemini.from_chat(result, gemini.to_chat(
        {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}))["candidates"][0]["content"]["parts"][1]
    assert signature == encrypted == thought["thoughtSignature"] == encode_reasoning(TEXT)


def test_registry_is_keyed_by_model_providers() -> None:
    assert tuple(ADAPTERS) == PROVIDERS
    for name in PROVIDERS:
        assert adapter(name).PROVIDER == name
    with pytest.raises(KeyError):
        adapter("cohere")


@pytest.mark.parametrize("provider", PROVIDERS)
def test_each_adapter_offers_the_whole_protocol(provider: str) -> None:
    """No gateway hook needs hasattr: every member of base.Adapter is there (mypy checks the types)."""
    members = [m for m in vars(base.Adapter) if not m.startswith("_")] + ["PROVIDER"]
    missing = [m for m in members if not hasattr(ADAPTERS[provider], m)]
    assert not missing


def test_protocol_defaults_and_overrides() -> None:
    req = ChatRequest(model="m", messages=[])
    assert anthropic.stream_ping(req) == openai_chat.stream_ping(req) == base.PING
    assert gemini.stream_ping(req) == b"\n"
    assert openai_responses.stream_content_type(req) == "text/event-stream"
    gemini_req = ChatRequest(model="m", messages=[], extra={"alt": None})
    assert gemini.stream_content_type(gemini_req) == "application/json"
    # count bodies: each adapter makes a count body a body its to_chat accepts
    messages = [{"role": "user", "content": "hi"}]
    assert anthropic.to_chat(anthropic.count_request_body({"model": "m", "messages": messages})).messages
    assert openai_chat.count_request_body({"model": "m", "messages": messages}) == {"model": "m", "messages": messages}
    assert gemini.to_chat(gemini.count_request_body({"contents": [{"parts": [{"text": "hi"}]}]})).messages
    overflow = GatewayError("context_length", "too long")
    assert openai_responses.error_in_stream(overflow) and not openai_chat.error_in_stream(overflow)


@pytest.mark.parametrize("kind", sorted(base.ERROR_STATUS))
def test_openai_apis_share_one_error_object(kind: str) -> None:
    err = GatewayError(kind, "boom")
    status, body = openai_chat.error_response(err)
    assert (status, body) == openai_responses.error_response(err) == openai_errors.error_response(err)
    assert status == err.status and set(body["error"]) == {"message", "type", "param", "code"}
    chat_frames = b"".join(openai_chat.stream_error(err, ChatRequest(model="m", messages=[])))
    assert json.loads(chat_frames.split(b"\n\n")[0][len(b"data: "):]) == body
