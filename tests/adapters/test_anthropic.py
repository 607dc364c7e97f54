"""Anthropic Messages adapter: unit tests (no server) and integration tests through the gateway.

Responses and stream frames are checked with the official anthropic SDK's own types and stream
accumulator, so "valid" means "what a real Anthropic client accepts".
"""

from __future__ import annotations

import base64
import copy
import json
import re
from typing import Any, Iterator

import anthropic
import httpx2
import pytest
from anthropic.types import Message
from anthropic.types.shared import ErrorResponse

from polar_mq.proxy_app.adapters import anthropic as adapter
from polar_mq.proxy_app.adapters.base import ChatRequest, ChatResult, GatewayError
from polar_mq.proxy_app.adapters import reasoning as reasoning_token
from polar_mq.proxy_app.adapters.reasoning import decode_reasoning, encode_reasoning

PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n fake").decode()
BILLING = "x-anthropic-billing-header: cc_version=2.1.197.3fa; cc_entrypoint=sdk-cli; cch=0aaa9;"
WRITE_TOOL = {
    "name": "Write",
    "description": "Write a file",
    "input_schema": {"type": "object", "properties": {"file_path": {"type": "string"},
                                                      "content": {"type": "string"}},
                     "required": ["file_path", "content"]},
}


def body(**over: Any) -> dict[str, Any]:
    base = {"model": "claude-test", "max_tokens": 1024,
            "messages": [{"role": "user", "content": "hi"}]}
    base.update(over)
    return base


def claude_code_body() -> dict[str, Any]:
    """Shaped like what Claude Code 2.1.x sends on its second turn (trimmed)."""
    return {
        "model": "claude-sonnet-4-5",
        "max_tokens": 32000,
        "stream": True,
        "system": [
            {"type": "text", "text": BILLING},
            {"type": "text", "text": "You are Claude Code, Anthropic's official CLI for Claude.",
             "cache_control": {"type": "ephemeral"}},
            {"type": "text", "text": "Main instructions.", "cache_control": {"type": "ephemeral", "ttl": "1h"}},
        ],
        "messages": [
            {"role": "user", "content": [
                {"type": "text", "text": "<system-reminder>ctx</system-reminder>"},
                {"type": "text", "text": "create polar.txt", "cache_control": {"type": "ephemeral"}},
            ]},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "I should write.", "signature": encode_reasoning("I should write.")},
                {"type": "text", "text": "Writing it."},
                {"type": "tool_use", "id": "toolu_01A", "name": "Write",
                 "input": {"file_path": "polar.txt", "content": "x"}},
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_01A",
                 "content": [{"type": "text", "text": "File created"}]},
            ]},
            {"role": "system", "content": "<reminder>mid-conversation system note</reminder>"},
            {"role": "user", "content": "thanks"},
        ],
        "tools": [WRITE_TOOL, {"type": "web_search_20250305", "name": "web_search", "max_uses": 5}],
        "tool_choice": {"type": "auto"},
        "thinking": {"type": "adaptive"},
        "output_config": {"effort": "high"},
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        "metadata": {"user_id": "user_abc_account__session_1"},
        "temperature": 1,
    }


def result(message: dict[str, Any], finish: str = "stop", **kw: Any) -> ChatResult:
    return ChatResult(id="chatcmpl-abc123", model="served/Qwen3", message=message, finish_reason=finish,
                      prompt_tokens=kw.pop("prompt_tokens", 42), completion_tokens=kw.pop("completion_tokens", 7),
                      **kw)


def gateway_error(call: Any) -> GatewayError:
    with pytest.raises(GatewayError) as info:
        call()
    return info.value


# ----------------------------------------------------------------------------------------------
# Requests
# ----------------------------------------------------------------------------------------------

def test_claude_code_request_normalised_exactly() -> None:
    req = adapter.to_chat(claude_code_body())
    assert req.model == "claude-sonnet-4-5" and req.stream is True
    assert req.messages == [
        {"role": "system", "content": "You are Claude Code, Anthropic's official CLI for Claude.\n\nMain instructions."},
        {"role": "user", "content": "<system-reminder>ctx</system-reminder>\ncreate polar.txt"},
        {"role": "assistant", "content": "Writing it.", "reasoning": "I should write.",
         "tool_calls": [{"id": "toolu_01A", "type": "function",
                         "function": {"name": "Write", "arguments": '{"file_path": "polar.txt", "content": "x"}'}}]},
        {"role": "tool", "tool_call_id": "toolu_01A", "content": "File created"},
        {"role": "system", "content": "<reminder>mid-conversation system note</reminder>"},
        {"role": "user", "content": "thanks"},
    ]
    assert req.tools == [{"type": "function", "function": {
        "name": "Write", "parameters": WRITE_TOOL["input_schema"], "description": "Write a file"}}]
    assert req.params == {"max_tokens": 32000, "temperature": 1, "tool_choice": "auto",
                          "chat_template_kwargs": {"enable_thinking": True}}
    notes = " | ".join(req.notes)
    for expected in ("billing-header", "dropped server tool web_search", "enable_thinking=true",
                     "context_management", "effort"):
        assert expected in notes
    assert req.extra["thinking"] is True


def test_billing_header_changes_do_not_change_messages() -> None:
    """Two turns differing only in the billing nonce must normalise identically (prefix merging)."""
    a, b = claude_code_body(), claude_code_body()
    b["system"][0]["text"] = BILLING.replace("0aaa9", "36ee5")
    assert adapter.to_chat(a).messages == adapter.to_chat(b).messages


@pytest.mark.parametrize("system, expected", [
    (BILLING + "\nYou are helpful.", "You are helpful."),
    (BILLING, None),
    ([{"type": "text", "text": BILLING + "\nKeep me"}, {"type": "text", "text": "Second"}], "Keep me\n\nSecond"),
    ([{"type": "text", "text": "First"}, {"type": "text", "text": BILLING}], "First\n\n" + BILLING),
    ("plain system", "plain system"),
])
def test_billing_line_stripped_from_first_block_only(system: Any, expected: str | None) -> None:
    msgs = adapter.to_chat(body(system=system)).messages
    if expected is None:
        assert msgs[0]["role"] == "user"
    else:
        assert msgs[0] == {"role": "system", "content": expected}


def test_images_base64_url_and_in_tool_results() -> None:
    req = adapter.to_chat(body(messages=[
        {"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}},
            {"type": "image", "source": {"type": "url", "url": "https://example.com/a.jpg"}},
            {"type": "text", "text": "what is this"}]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "shot", "input": {}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": [
                {"type": "text", "text": "screenshot:"},
                {"type": "image", "source": {"type": "base64", "media_type": "image/jpeg", "data": PNG}}]},
            {"type": "text", "text": "look"}]},
    ]))
    assert req.messages[0]["content"] == [
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}},
        {"type": "image_url", "image_url": {"url": "https://example.com/a.jpg"}},
        {"type": "text", "text": "what is this"}]
    assert req.messages[1] == {"role": "assistant", "content": None, "tool_calls": [
        {"id": "toolu_1", "type": "function", "function": {"name": "shot", "arguments": "{}"}}]}
    assert req.messages[2] == {"role": "tool", "tool_call_id": "toolu_1", "content": "screenshot:"}
    assert req.messages[3] == {"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": f"data:image/jpeg;base64,{PNG}"}},
        {"type": "text", "text": "look"}]}
    assert any("tool-result image" in n for n in req.notes)


def test_tool_results_string_empty_error_and_parallel() -> None:
    req = adapter.to_chat(body(messages=[
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": [
            {"type": "tool_use", "id": "toolu_a", "name": "Bash", "input": {"command": "ls"}},
            {"type": "tool_use", "id": "toolu_b", "name": "Bash", "input": {"command": "pwd"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_a", "content": "boom", "is_error": True},
            {"type": "tool_result", "tool_use_id": "toolu_b"}]},
    ]))
    assert req.messages[2:] == [
        {"role": "tool", "tool_call_id": "toolu_a", "content": "Error: boom"},
        {"role": "tool", "tool_call_id": "toolu_b", "content": ""}]
    assert any("is_error" in n for n in req.notes)


def test_documents_and_unknown_blocks() -> None:
    req = adapter.to_chat(body(messages=[{"role": "user", "content": [
        {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "doc text"}},
        {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBER"}},
        {"type": "document", "source": {"type": "content", "content": [{"type": "text", "text": "inner"}]}},
        {"type": "future_block", "x": 1},
    ]}]))
    assert req.messages == [{"role": "user", "content": "doc text\ninner"}]
    assert any("base64" in n for n in req.notes) and any("future_block" in n for n in req.notes)


def test_assistant_server_blocks_and_redacted_thinking_dropped() -> None:
    req = adapter.to_chat(body(messages=[
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": [
            {"type": "redacted_thinking", "data": "opaque"},
            {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {"query": "x"}},
            {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1", "content": []},
            {"type": "text", "text": "answer"}]},
    ]))
    assert req.messages[1] == {"role": "assistant", "content": "answer"}
    assert {"dropped redacted_thinking block", "dropped server block server_tool_use"} <= set(req.notes)


def test_thinking_signature_round_trip() -> None:
    reasoning = "Let me think… about ünïcode and\nnewlines."
    sig = encode_reasoning(reasoning)
    assert decode_reasoning(sig) == reasoning
    assert decode_reasoning("EqQBCkgIARABGAIiQL") is None
    assert decode_reasoning(reasoning_token.LEGACY_ANTHROPIC_PREFIX + "!!notbase64") is None

    def assistant(thinking: str, signature: str) -> dict[str, Any]:
        req = adapter.to_chat(body(messages=[
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": [{"type": "thinking", "thinking": thinking, "signature": signature},
                                              {"type": "text", "text": "a"}]},
            {"role": "user", "content": "q2"}]))
        return {"message": req.messages[1], "notes": req.notes}

    same = assistant(reasoning, sig)
    assert same["message"]["reasoning"] == reasoning and same["notes"] == []
    trimmed = assistant(reasoning.strip()[:10], sig)  # a client that rewrote the visible text
    assert trimmed["message"]["reasoning"] == reasoning
    assert any("signed original" in n for n in trimmed["notes"])
    foreign = assistant("real claude thought", "EqQBCkgIARABGAIiQL")
    assert foreign["message"]["reasoning"] == "real claude thought"
    assert any("not issued" in n for n in foreign["notes"])


def test_response_to_next_request_round_trip_is_exact() -> None:
    """What we answer, sent back as history, must normalise to what the upstream produced."""
    upstream = {"role": "assistant", "content": "I'll write it.", "reasoning": "plan: write",
                "tool_calls": [{"id": "call_1", "type": "function",
                                "function": {"name": "Write", "arguments": '{"file_path": "polar.txt", "content": "hi"}'}}]}
    req = adapter.to_chat(body(tools=[WRITE_TOOL]))
    answer = Message.model_validate(adapter.from_chat(result(copy.deepcopy(upstream), "tool_calls"), req))
    history = adapter.to_chat(body(messages=[
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in answer.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_1", "content": "ok"}]}]))
    assert history.messages[1] == upstream
    assert history.notes == []


def test_tools_and_tool_choice() -> None:
    tools = [WRITE_TOOL, {"type": "custom", "name": "Read", "input_schema": {"type": "object"}, "strict": True},
             {"type": "bash_20250124", "name": "bash"}, {"type": "code_execution_20250825", "name": "code_execution"}]
    req = adapter.to_chat(body(tools=tools, tool_choice={"type": "any", "disable_parallel_tool_use": True}))
    assert [t["function"]["name"] for t in req.tools] == ["Write", "Read"]
    assert req.tools[1]["function"] == {"name": "Read", "parameters": {"type": "object"}, "strict": True}
    assert req.params["tool_choice"] == "required" and req.params["parallel_tool_calls"] is False
    assert sum("dropped server tool" in n for n in req.notes) == 2


@pytest.mark.parametrize("choice, expected", [
    ({"type": "auto"}, "auto"),
    ({"type": "any"}, "required"),
    ({"type": "none"}, "none"),
    ({"type": "tool", "name": "Write"}, {"type": "function", "function": {"name": "Write"}}),
])
def test_tool_choice_mapping(choice: dict[str, Any], expected: Any) -> None:
    assert adapter.to_chat(body(tools=[WRITE_TOOL], tool_choice=choice)).params["tool_choice"] == expected


def test_tool_choice_without_client_tools_is_dropped() -> None:
    req = adapter.to_chat(body(tools=[{"type": "web_search_20250305", "name": "web_search"}],
                               tool_choice={"type": "any"}))
    assert req.tools == [] and "tool_choice" not in req.params


def test_sampling_params_and_output_formats() -> None:
    schema = {"type": "object", "properties": {"title": {"type": "string"}}, "required": ["title"]}
    req = adapter.to_chat(body(temperature=0.2, top_p=0.9, top_k=40, stop_sequences=["END", "\n\nHuman:"],
                               thinking={"type": "enabled", "budget_tokens": 2048},
                               output_config={"format": {"type": "json_schema", "schema": schema}}))
    assert req.params == {"max_tokens": 1024, "temperature": 0.2, "top_p": 0.9, "top_k": 40,
                          "stop": ["END", "\n\nHuman:"], "chat_template_kwargs": {"enable_thinking": True},
                          "response_format": {"type": "json_schema",
                                              "json_schema": {"name": "output", "schema": schema, "strict": True}}}
    beta = adapter.to_chat(body(output_format={"type": "json_schema", "schema": schema}, thinking={"type": "disabled"}))
    assert beta.params["response_format"]["json_schema"]["schema"] == schema
    assert beta.params["chat_template_kwargs"] == {"enable_thinking": False}
    assert beta.extra["thinking"] is False


@pytest.mark.parametrize("patch, field", [
    ({"max_tokens": None}, "max_tokens"),
    ({"max_tokens": "10"}, "max_tokens"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"model": None}, "model"),
    ({"messages": "hi"}, "messages"),
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "bot", "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "user"}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": [{"text": "no type"}]}]}, "messages[0].content[0].type"),
    ({"messages": [{"role": "user", "content": [{"type": "text"}]}]}, "messages[0].content[0].text"),
    ({"messages": [{"role": "user", "content": [{"type": "image"}]}]}, "messages[0].content[0].source"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "base64", "data": "x"}}]}]},
     "messages[0].content[0].source.media_type"),
    ({"messages": [{"role": "assistant", "content": [{"type": "tool_use", "name": "x", "input": {}}]}]},
     "messages[0].content[0].id"),
    ({"messages": [{"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "x", "input": [1]}]}]},
     "messages[0].content[0].input"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_result", "content": "x"}]}]},
     "messages[0].content[0].tool_use_id"),
    ({"system": 5}, "system"),
    ({"system": [{"type": "image"}]}, "system[0].type"),
    ({"tools": [{"name": "x"}]}, "tools[0].input_schema"),
    ({"tools": [{"input_schema": {}}]}, "tools[0].name"),
    ({"tools": {"name": "x"}}, "tools"),
    ({"tool_choice": {"type": "sometimes"}}, "tool_choice.type"),
    ({"tools": [WRITE_TOOL], "tool_choice": {"type": "tool", "name": "Nope"}}, "tool_choice.name"),
    ({"temperature": "hot"}, "temperature"),
    ({"stop_sequences": [1]}, "stop_sequences"),
    ({"thinking": {"type": "maybe"}}, "thinking.type"),
    ({"output_config": {"format": {"type": "json_schema"}}}, "output_config.format.schema"),
    ({"output_format": {"type": "xml", "schema": {}}}, "output_format.type"),
    ({"stream": "yes"}, "stream"),
])
def test_bad_requests_name_the_field(patch: dict[str, Any], field: str) -> None:
    err = gateway_error(lambda: adapter.to_chat(body(**patch)))
    assert err.kind == "invalid_request" and err.status == 400
    assert f"'{field}'" in err.message
    status, payload = adapter.error_response(err)
    assert status == 400 and ErrorResponse.model_validate(payload).error.type == "invalid_request_error"


def test_non_object_body_rejected() -> None:
    assert gateway_error(lambda: adapter.to_chat(["x"])).kind == "invalid_request"  # type: ignore[arg-type]


# ----------------------------------------------------------------------------------------------
# Responses
# ----------------------------------------------------------------------------------------------

def test_response_blocks_order_and_sdk_validation() -> None:
    req = adapter.to_chat(body(model="claude-opus-4-1", tools=[WRITE_TOOL]))
    res = result({"role": "assistant", "content": "On it.", "reasoning": "think first",
                  "tool_calls": [{"id": "call_x", "type": "function",
                                  "function": {"name": "Write", "arguments": '{"file_path": "polar.txt"}'}},
                                 {"type": "function", "function": {"name": "Write", "arguments": ""}},
                                 {"type": "function", "function": {"name": "Write", "arguments": "{}"}}]},
                 "tool_calls")
    msg = Message.model_validate(adapter.from_chat(res, req))
    assert msg.id.startswith("msg_") and msg.model == "claude-opus-4-1"
    assert [b.type for b in msg.content] == ["thinking", "text", "tool_use", "tool_use", "tool_use"]
    assert msg.content[0].thinking == "think first"
    assert decode_reasoning(msg.content[0].signature) == "think first"
    assert msg.content[2].id == "call_x" and msg.content[2].input == {"file_path": "polar.txt"}
    generated = [msg.content[3].id, msg.content[4].id]
    assert all(i.startswith("toolu_") for i in generated) and len(set(generated)) == 2
    assert msg.content[3].input == {}
    assert msg.stop_reason == "tool_use" and msg.stop_sequence is None
    assert msg.usage.model_dump(exclude_none=True) == {
        "input_tokens": 42, "output_tokens": 7, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}


@pytest.mark.parametrize("finish, raw_stop, stops, expected", [
    ("stop", None, [], ("end_turn", None)),
    ("length", None, [], ("max_tokens", None)),
    ("stop", "END", ["END"], ("stop_sequence", "END")),
    ("stop", 151645, ["END"], ("end_turn", None)),  # vLLM reports an eos token id, not a string
    ("stop", "other", ["END"], ("end_turn", None)),
    ("tool_calls", None, [], ("tool_use", None)),
])
def test_stop_reason_mapping(finish: str, raw_stop: Any, stops: list[str], expected: tuple[str, Any]) -> None:
    req = adapter.to_chat(body(stop_sequences=stops) if stops else body())
    res = result({"role": "assistant", "content": "text"}, finish,
                 raw={"choices": [{"finish_reason": finish, "stop_reason": raw_stop}]})
    msg = Message.model_validate(adapter.from_chat(res, req))
    assert (msg.stop_reason, msg.stop_sequence) == expected


def test_empty_answer_still_has_a_block() -> None:
    msg = Message.model_validate(adapter.from_chat(result({"role": "assistant", "content": None}, "length"),
                                                   adapter.to_chat(body())))
    assert [b.type for b in msg.content] == ["text"] and msg.stop_reason == "max_tokens"


def test_invalid_tool_arguments_still_give_an_object() -> None:
    res = result({"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{not json"}},
        {"id": "c2", "type": "function", "function": {"name": "f", "arguments": "[1, 2]"}}]}, "tool_calls")
    msg = Message.model_validate(adapter.from_chat(res, adapter.to_chat(body())))
    assert msg.content[0].input == {"_raw": "{not json"} and msg.content[1].input == {"_raw": "[1, 2]"}
    final = _stream_through_sdk(res, adapter.to_chat(body()))
    assert [b.input for b in final.content] == [{"_raw": "{not json"}, {"_raw": "[1, 2]"}]


# ----------------------------------------------------------------------------------------------
# Streams, parsed by the real SDK (its HTTP transport replaced by one that replays our frames)
# ----------------------------------------------------------------------------------------------

def _sdk_client(frames: bytes, status: int = 200) -> anthropic.Anthropic:
    def handler(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(status, content=frames, headers={"content-type": "text/event-stream"})
    return anthropic.Anthropic(api_key="k", base_url="http://test", max_retries=0,
                               http_client=httpx2.Client(transport=httpx2.MockTransport(handler)))


def _stream_through_sdk(res: ChatResult, req: ChatRequest) -> Message:
    frames = b"".join(adapter.stream_events(res, req))
    client = _sdk_client(frames)
    with client.messages.stream(model=req.model, max_tokens=10, messages=[{"role": "user", "content": "x"}]) as s:
        return s.get_final_message()


def _frames(raw: bytes) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for frame in raw.decode().split("\n\n"):
        if not frame.strip():
            continue
        lines = dict(line.split(": ", 1) for line in frame.split("\n"))
        out.append((lines["event"], json.loads(lines["data"])))
    return out


def test_stream_matches_non_streaming_answer() -> None:
    long_text = "Ünïcödé 🚀 text with  double  spaces,\ttabs\nand newlines " * 9
    args = '{"file_path": "polar.txt", "content": "' + "y" * 70 + '"}'
    res = result({"role": "assistant", "content": long_text, "reasoning": "deep thought " * 5,
                  "tool_calls": [{"id": "call_7", "type": "function",
                                  "function": {"name": "Write", "arguments": args}}]}, "tool_calls")
    req = adapter.to_chat(body(model="claude-haiku-4-5", stream=True, tools=[WRITE_TOOL]))
    streamed = _stream_through_sdk(res, req)
    whole = Message.model_validate(adapter.from_chat(res, req))
    assert streamed.model_dump(exclude={"id"}) == whole.model_dump(exclude={"id"})
    assert streamed.content[1].text == long_text
    assert streamed.model == "claude-haiku-4-5" and streamed.stop_reason == "tool_use"
    assert streamed.usage.input_tokens == 42 and streamed.usage.output_tokens == 7


def test_stream_event_sequence() -> None:
    res = result({"role": "assistant", "content": "hello", "reasoning": "r",
                  "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": ""}}]},
                 "tool_calls")
    events = _frames(b"".join(adapter.stream_events(res, adapter.to_chat(body()))))
    names = [e for e, _ in events]
    assert all(data["type"] == name for name, data in events)
    assert names == ["message_start",
                     "content_block_start", "content_block_delta", "content_block_delta", "content_block_stop",
                     "content_block_start", "content_block_delta", "content_block_stop",
                     "content_block_start", "content_block_delta", "content_block_stop",
                     "message_delta", "message_stop"]
    start = events[0][1]["message"]
    assert start["content"] == [] and start["stop_reason"] is None and start["usage"]["input_tokens"] == 42
    assert [d["delta"]["type"] for _, d in events[2:4]] == ["thinking_delta", "signature_delta"]
    assert [d["index"] for n, d in events if n.startswith("content_block")] == [0] * 4 + [1] * 3 + [2] * 3
    assert events[9][1]["delta"] == {"type": "input_json_delta", "partial_json": "{}"}
    assert events[11][1]["delta"]["stop_reason"] == "tool_use" and events[11][1]["usage"]["output_tokens"] == 7


def test_stream_error_frame_raises_in_sdk() -> None:
    err = GatewayError("upstream_unavailable", "all upstreams down")
    req = adapter.to_chat(body())
    frames = b"".join(adapter.stream_events(result({"role": "assistant", "content": "partial"}), req))
    frames = frames.split(b"event: message_delta")[0] + b"".join(adapter.stream_error(err, req))
    with pytest.raises(anthropic.APIStatusError) as info:
        with _sdk_client(frames).messages.stream(model="m", max_tokens=5, messages=[{"role": "user", "content": "x"}]) as s:
            s.get_final_message()
    assert info.value.body["error"] == {"type": "overloaded_error", "message": "all upstreams down"}
    assert adapter.error_in_stream(err) is False


# ----------------------------------------------------------------------------------------------
# Errors
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind, status, etype, sdk_error", [
    ("invalid_request", 400, "invalid_request_error", anthropic.BadRequestError),
    ("authentication", 401, "authentication_error", anthropic.AuthenticationError),
    ("permission", 403, "permission_error", anthropic.PermissionDeniedError),
    ("not_found", 404, "not_found_error", anthropic.NotFoundError),
    ("too_large", 413, "request_too_large", anthropic.ContentTooLargeError),
    ("rate_limit", 429, "rate_limit_error", anthropic.RateLimitError),
    ("upstream_error", 502, "api_error", anthropic.InternalServerError),
    ("upstream_unavailable", 529, "overloaded_error", anthropic.OverloadedError),
    ("store_unavailable", 529, "overloaded_error", anthropic.OverloadedError),
    ("upstream_timeout", 504, "timeout_error", anthropic.GatewayTimeoutError),
    ("internal", 500, "api_error", anthropic.InternalServerError),
])
def test_error_shapes(kind: str, status: int, etype: str, sdk_error: type) -> None:
    got_status, payload = adapter.error_response(GatewayError(kind, "boom"))
    assert got_status == status
    assert payload == {"type": "error", "error": {"type": etype, "message": "boom"}}
    if etype != "request_too_large":  # documented for 413, but missing from the SDK's ErrorType literal
        assert ErrorResponse.model_validate(payload).error.type == etype
    client = _error_client(got_status, payload)
    with pytest.raises(sdk_error) as info:
        client.messages.create(model="m", max_tokens=5, messages=[{"role": "user", "content": "x"}])
    assert info.value.status_code == status and info.value.body == payload


def _error_client(status: int, payload: dict[str, Any]) -> anthropic.Anthropic:
    def handler(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(status, json=payload)
    return anthropic.Anthropic(api_key="k", base_url="http://test", max_retries=0,
                               http_client=httpx2.Client(transport=httpx2.MockTransport(handler)))


def test_upstream_error_keeps_its_5xx_status() -> None:
    assert adapter.error_response(GatewayError("upstream_error", "x", status=503))[0] == 503
    assert adapter.error_response(GatewayError("upstream_error", "x", status=400))[0] == 502


@pytest.mark.parametrize("err, message", [
    (GatewayError("context_length", "too long", detail={"prompt_tokens": 40000, "max_model_len": 32768}),
     "prompt is too long: 40000 tokens > 32768 maximum"),
    (GatewayError("context_length", "This model's maximum context length is 4096 tokens. However, you requested "
                  "5000 tokens (4000 in the messages, 1000 in the completion)."),
     "prompt is too long: 5000 tokens > 4096 maximum"),
    (GatewayError("context_length", "input too long"), "prompt is too long: input too long"),
])
def test_context_overflow_message_claude_code_recognises(err: GatewayError, message: str) -> None:
    status, payload = adapter.error_response(err)
    assert status == 400
    assert payload["error"] == {"type": "invalid_request_error", "message": message}


def test_count_tokens_response_validates() -> None:
    from anthropic.types import MessageTokensCount
    assert MessageTokensCount.model_validate(adapter.count_tokens_response(17)).input_tokens == 17


# ----------------------------------------------------------------------------------------------
# Integration: the official SDK through the real gateway (fixtures from tests/conftest.py)
# ----------------------------------------------------------------------------------------------

@pytest.fixture
def gw(gateway: Any) -> Any:
    return gateway


@pytest.fixture
def client(session: dict[str, Any]) -> Iterator[anthropic.Anthropic]:
    c = anthropic.Anthropic(base_url=session["base_urls"]["anthropic"], api_key=session["key"], max_retries=0)
    yield c
    c.close()


def _user(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


def test_sdk_non_streaming(client: anthropic.Anthropic, gw: Any, session: dict[str, Any]) -> None:
    msg = client.messages.create(model="claude-test", max_tokens=64, messages=_user("polar:say=Hello there"),
                                 system=[{"type": "text", "text": BILLING}, {"type": "text", "text": "Be brief."}])
    assert msg.model == "claude-test" and msg.content[0].type == "text"
    assert msg.content[0].text == "Hello there" and msg.stop_reason == "end_turn"
    calls = gw.calls(session["session_id"])
    assert len(calls) == 1
    rec = calls[0]
    assert rec["provider"] == "anthropic" and rec["model_requested"] == "claude-test" and rec["stream"] is False
    assert rec["messages"][0] == {"role": "system", "content": "Be brief."}
    assert rec["status"] == "ok"
    _check_token_ids(rec, gw)


def test_sdk_streaming(client: anthropic.Anthropic, gw: Any, session: dict[str, Any]) -> None:
    text = "streamed  text, unaltered ✓ " * 4
    with client.messages.stream(model="claude-test", max_tokens=256, messages=_user(f"polar:say={text}")) as s:
        pieces = list(s.text_stream)
        final = s.get_final_message()
    assert "".join(pieces) == final.content[0].text == text
    assert final.model == "claude-test" and final.stop_reason == "end_turn" and final.usage.output_tokens > 0
    (rec,) = gw.calls(session["session_id"])
    assert rec["stream"] is True and rec["provider"] == "anthropic"
    _check_token_ids(rec, gw)


def test_sdk_tool_round_trip(client: anthropic.Anthropic, gw: Any, session: dict[str, Any]) -> None:
    messages: list[dict[str, Any]] = _user("create a file please")
    first = client.messages.create(model="claude-test", max_tokens=256, messages=messages, tools=[WRITE_TOOL])
    assert first.stop_reason == "tool_use"
    use = next(b for b in first.content if b.type == "tool_use")
    assert use.name == "Write" and use.input.get("file_path") == "polar.txt"
    messages += [first.to_param(), {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": use.id, "content": "File written"}]}]
    with client.messages.stream(model="claude-test", max_tokens=256, messages=messages, tools=[WRITE_TOOL]) as s:
        second = s.get_final_message()
    assert second.stop_reason == "end_turn" and second.content[-1].type == "text" and second.content[-1].text
    calls = gw.calls(session["session_id"])
    assert len(calls) == 2
    assert calls[1]["messages"][-1] == {"role": "tool", "tool_call_id": use.id, "content": "File written"}
    assert calls[1]["messages"][-2]["tool_calls"][0]["id"] == use.id
    for rec in calls:
        _check_token_ids(rec, gw)


def test_sdk_thinking_round_trip(client: anthropic.Anthropic, gw: Any, session: dict[str, Any]) -> None:
    messages: list[dict[str, Any]] = _user("polar:think solve it")
    first = client.messages.create(model="claude-test", max_tokens=512, messages=messages,
                                   thinking={"type": "enabled", "budget_tokens": 1024})
    thinking = next(b for b in first.content if b.type == "thinking")
    assert thinking.thinking and thinking.signature
    messages += [first.to_param(), {"role": "user", "content": "and again"}]
    with client.messages.stream(model="claude-test", max_tokens=512, messages=messages,
                                thinking={"type": "enabled", "budget_tokens": 1024}) as s:
        s.get_final_message()
    calls = gw.calls(session["session_id"])
    assert len(calls) == 2
    history = calls[1]["messages"][1]
    assert history["role"] == "assistant" and history["reasoning"] == calls[0]["response_message"]["reasoning"]
    assert history["reasoning"] == thinking.thinking


def test_sdk_streamed_parallel_tool_calls(client: anthropic.Anthropic, gw: Any, session: dict[str, Any]) -> None:
    with client.messages.stream(model="claude-test", max_tokens=256, tools=[WRITE_TOOL],
                                messages=_user("polar:parallel write two files")) as s:
        final = s.get_final_message()
    uses = [b for b in final.content if b.type == "tool_use"]
    assert final.stop_reason == "tool_use" and len(uses) == 2 and len({u.id for u in uses}) == 2
    (rec,) = gw.calls(session["session_id"])
    recorded = rec["response_message"]["tool_calls"]
    assert [u.id for u in uses] == [c["id"] for c in recorded]
    assert [u.input for u in uses] == [json.loads(c["function"]["arguments"]) for c in recorded]


def test_sdk_json_output_format(client: anthropic.Anthropic, gw: Any, session: dict[str, Any]) -> None:
    schema = {"type": "object", "properties": {"title": {"type": "string"}}, "required": ["title"],
              "additionalProperties": False}
    msg = client.messages.create(model="claude-test", max_tokens=128, messages=_user("polar:json give a title"),
                                 output_config={"format": {"type": "json_schema", "schema": schema}})
    assert isinstance(json.loads(msg.content[0].text)["title"], str)


def test_sdk_context_overflow_is_claude_codes_400(client: anthropic.Anthropic, gw: Any,
                                                 session: dict[str, Any]) -> None:
    """Claude Code streams; an early upstream error must still be an HTTP 400 it can parse."""
    with pytest.raises(anthropic.BadRequestError) as info:
        with client.messages.stream(model="claude-test", max_tokens=10_000_000, messages=_user("hi")) as s:
            s.get_final_message()
    error = info.value.body["error"]
    assert error["type"] == "invalid_request_error"
    assert re.fullmatch(r"prompt is too long: \d+ tokens > \d+ maximum", error["message"]), error["message"]


def test_sdk_count_tokens_records_nothing(client: anthropic.Anthropic, gw: Any, session: dict[str, Any]) -> None:
    count = client.messages.count_tokens(model="claude-test", messages=_user("count these words please"),
                                         tools=[WRITE_TOOL])
    assert count.input_tokens > 0
    assert gw.calls(session["session_id"]) == []


def test_sdk_beta_messages(client: anthropic.Anthropic, gw: Any, session: dict[str, Any]) -> None:
    msg = client.beta.messages.create(model="claude-test", max_tokens=64, messages=_user("polar:say=beta ok"),
                                      betas=["interleaved-thinking-2025-05-14"])
    assert msg.content[0].text == "beta ok" and msg.model == "claude-test"
    (rec,) = gw.calls(session["session_id"])
    assert rec["request"]["messages"] == _user("polar:say=beta ok")


def test_sdk_bad_request_and_unknown_key(client: anthropic.Anthropic, gw: Any, session: dict[str, Any]) -> None:
    with pytest.raises(anthropic.BadRequestError) as info:
        client.post("/v1/messages", cast_to=object,
                    body={"model": "claude-test", "messages": _user("hi")})
    assert info.value.body["error"]["type"] == "invalid_request_error"
    assert "max_tokens" in info.value.body["error"]["message"]
    stranger = anthropic.Anthropic(base_url=gw.url, api_key="not-a-session-key", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as auth:
        stranger.messages.create(model="claude-test", max_tokens=8, messages=_user("hi"))
    assert auth.value.status_code == 401
    assert auth.value.body["type"] == "error" and auth.value.body["error"]["type"] == "authentication_error"
    assert gw.calls(session["session_id"]) == []


def _check_token_ids(rec: dict[str, Any], gw: Any) -> None:
    """Ids recorded must be exactly what the upstream gives for the same normalised request."""
    assert rec["prompt_token_ids"] and rec["completion_token_ids"]
    assert len(rec["completion_logprobs"]) == len(rec["completion_token_ids"])
    payload: dict[str, Any] = {"model": rec["model_served"], "messages": rec["messages"], "max_tokens": 512}
    if rec["tools"]:
        payload["tools"] = rec["tools"]
    reply = gw.upstream_chat(payload)
    assert reply["prompt_token_ids"] == rec["prompt_token_ids"]
    assert reply["choices"][0]["token_ids"] == rec["completion_token_ids"]
