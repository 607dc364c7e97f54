"""OpenAI Responses adapter: unit tests of the conversion (validated by the openai SDK's own
types and stream helper) and integration tests through the real gateway with the SDK as client."""

from __future__ import annotations

import json
from typing import Any, Iterator

try:  # the HTTP library the installed openai SDK is built on (httpx2 in 3.x, httpx before)
    import httpx2 as httpx
except ImportError:  # pragma: no cover
    import httpx  # type: ignore[no-redef]
import openai
import pytest
import requests
from openai.types.responses import Response

from polar_mq.proxy_app.adapters import openai_responses as ad
from polar_mq.proxy_app.adapters.base import ChatResult, GatewayError
from polar_mq.proxy_app.adapters import reasoning as reasoning_token
from polar_mq.proxy_app.adapters.reasoning import decode_reasoning, encode_reasoning

APPLY_PATCH = {
    "type": "custom",
    "name": "apply_patch",
    "description": "Use the `apply_patch` tool to edit files.",
    "format": {"type": "grammar", "syntax": "lark",
               "definition": 'start: begin_patch hunk+ end_patch\nbegin_patch: "*** Begin Patch" LF'},
}
EXEC_COMMAND = {
    "type": "function", "name": "exec_command", "description": "Runs a command in a PTY.",
    "strict": False,
    "parameters": {"type": "object", "properties": {"cmd": {"type": "string"},
                                                    "workdir": {"type": "string"}},
                   "required": ["cmd"], "additionalProperties": False},
}
WRITE_FILE = {
    "type": "function", "name": "write_file", "description": "Write a file.",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"},
                                                    "content": {"type": "string"}},
                   "required": ["path", "content"]},
}


def result(content: str | None = "", *, reasoning: str | None = None,
           tool_calls: list[dict[str, Any]] | None = None, finish: str = "stop") -> ChatResult:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if reasoning:
        message["reasoning"] = reasoning
    if tool_calls:
        message["tool_calls"] = tool_calls
    return ChatResult(id="chatcmpl-1", model="served-model", message=message, finish_reason=finish,
                      prompt_token_ids=[1, 2, 3], completion_token_ids=[4, 5], logprobs=[-0.1, -0.2],
                      prompt_tokens=3, completion_tokens=2, created=1700000000)


def call(name: str, arguments: str, call_id: str = "call_1") -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def invalid(body: dict[str, Any]) -> str:
    with pytest.raises(GatewayError) as info:
        ad.to_chat(body)
    assert info.value.kind == "invalid_request" and info.value.status == 400
    return info.value.message


# ------------------------------------------------------------------ request conversion


def test_string_input_and_instructions():
    req = ad.to_chat({"model": "gpt-5", "instructions": "Be brief.", "input": "hello"})
    assert req.model == "gpt-5" and not req.stream
    assert req.messages == [{"role": "system", "content": "Be brief."},
                            {"role": "user", "content": "hello"}]
    assert req.tools == [] and req.params == {}
    assert req.extra["response_id"].startswith("resp_")


def test_instructions_as_items_and_developer_role_in_place():
    req = ad.to_chat({"model": "m",
                      "instructions": [{"role": "developer", "content": "rules"}],
                      "input": [{"role": "user", "content": "a"},
                                {"role": "developer", "content": [{"type": "input_text", "text": "mode change"}]},
                                {"role": "user", "content": "b"}]})
    assert req.messages == [{"role": "system", "content": "rules"}, {"role": "user", "content": "a"},
                            {"role": "system", "content": "mode change"}, {"role": "user", "content": "b"}]


def test_codex_shaped_body():
    """What Codex sends on its second turn: developer items with ids, store false, encrypted
    reasoning, a function call and a custom (apply_patch) call with their outputs."""
    reasoning_token = encode_reasoning("I should list files first.")
    body = {
        "model": "gpt-5-codex", "store": False, "stream": True,
        "include": ["reasoning.encrypted_content"], "tool_choice": "auto", "parallel_tool_calls": False,
        "reasoning": {"effort": "medium", "summary": "auto"}, "prompt_cache_key": "abc",
        "tools": [EXEC_COMMAND, APPLY_PATCH, {"type": "web_search", "external_web_access": False}],
        "input": [
            {"type": "message", "id": "msg_d1", "role": "developer",
             "content": [{"type": "input_text", "text": "You are Codex."}]},
            {"type": "message", "role": "user",
             "content": [{"type": "input_text", "text": "<environment_context>cwd</environment_context>"}]},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "fix it"}]},
            {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "short"}],
             "encrypted_content": reasoning_token},
            {"type": "function_call", "id": "fc_1", "call_id": "call_a", "name": "exec_command",
             "arguments": "{\"cmd\":\"ls\"}"},
            {"type": "function_call_output", "call_id": "call_a", "output": "a.py\n"},
            {"type": "custom_tool_call", "id": "ctc_1", "call_id": "call_b", "name": "apply_patch",
             "input": "*** Begin Patch\n*** End Patch\n"},
            {"type": "custom_tool_call_output", "call_id": "call_b", "output": "Done!"},
            {"type": "message", "role": "assistant",
             "content": [{"type": "output_text", "text": "Patched.", "annotations": []}]},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "thanks"}]},
        ],
    }
    req = ad.to_chat(body)
    assert req.stream is True
    assert req.messages == [
        {"role": "system", "content": "You are Codex."},
        {"role": "user", "content": "<environment_context>cwd</environment_context>"},
        {"role": "user", "content": "fix it"},
        {"role": "assistant", "content": None, "reasoning": "I should list files first.",
         "tool_calls": [call("exec_command", "{\"cmd\":\"ls\"}", "call_a")]},
        {"role": "tool", "tool_call_id": "call_a", "content": "a.py\n"},
        {"role": "assistant", "content": None,
         "tool_calls": [call("apply_patch", json.dumps({"input": "*** Begin Patch\n*** End Patch\n"}),
                             "call_b")]},
        {"role": "tool", "tool_call_id": "call_b", "content": "Done!"},
        {"role": "assistant", "content": "Patched."},
        {"role": "user", "content": "thanks"},
    ]
    names = [t["function"]["name"] for t in req.tools]
    assert names == ["exec_command", "apply_patch"]
    assert req.tools[0] == {"type": "function", "function": {
        "name": "exec_command", "description": "Runs a command in a PTY.",
        "parameters": EXEC_COMMAND["parameters"]}}
    patch = req.tools[1]["function"]
    assert patch["parameters"]["required"] == ["input"]
    assert patch["parameters"]["properties"]["input"]["type"] == "string"
    assert "begin_patch hunk+" in patch["description"]  # the grammar reaches the model
    assert req.custom_tools == ["apply_patch"]
    assert req.params == {"tool_choice": "auto", "parallel_tool_calls": False,
                          "chat_template_kwargs": {"reasoning_effort": "medium"}}
    assert "dropped server tool web_search" in req.notes


def test_reasoning_message_and_calls_merge_into_one_assistant_turn():
    """A model turn comes back as several items; the upstream must see the one message it made."""
    req = ad.to_chat({"model": "m", "input": [
        {"role": "user", "content": "go"},
        {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": encode_reasoning("r1")},
        {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
         "content": [{"type": "output_text", "text": "Working.", "annotations": []}]},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{\"a\":1}"},
        {"type": "function_call", "call_id": "c2", "name": "g", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "one"},
        {"type": "function_call_output", "call_id": "c2",
         "output": [{"type": "input_text", "text": "two"}]},
        {"type": "reasoning", "id": "rs_2", "summary": [{"type": "summary_text", "text": "s2"}]},
        {"type": "message", "role": "assistant", "content": "Final."},
    ]})
    assert req.messages == [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": "Working.", "reasoning": "r1",
         "tool_calls": [call("f", "{\"a\":1}", "c1"), call("g", "{}", "c2")]},
        {"role": "tool", "tool_call_id": "c1", "content": "one"},
        {"role": "tool", "tool_call_id": "c2", "content": "two"},
        {"role": "assistant", "content": "Final.", "reasoning": "s2"},
    ]


def test_consecutive_assistant_messages_stay_separate():
    req = ad.to_chat({"model": "m", "input": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "one"},
        {"role": "assistant", "content": "two"},
    ]})
    assert [m.get("content") for m in req.messages] == ["hi", "one", "two"]


def test_reasoning_sources():
    """Our token wins; reasoning_text content beats the summary; unreadable reasoning is noted."""
    def turn(item: dict[str, Any]) -> ad.ChatRequest:
        return ad.to_chat({"model": "m", "input": [{"role": "user", "content": "q"}, item,
                                                   {"role": "assistant", "content": "a"}]})

    foreign = {"type": "reasoning", "id": "rs", "encrypted_content": "gAAAAopaque",
               "summary": [{"type": "summary_text", "text": "one"}, {"type": "summary_text", "text": "two"}]}
    assert turn(foreign).messages[1]["reasoning"] == "one\n\ntwo"
    full = {**foreign, "content": [{"type": "reasoning_text", "text": "full thoughts"}]}
    assert turn(full).messages[1]["reasoning"] == "full thoughts"
    opaque = turn({"type": "reasoning", "id": "rs", "summary": [], "encrypted_content": "gAAAA"})
    assert opaque.messages[1] == {"role": "assistant", "content": "a"}
    assert any("reasoning without readable text" in n for n in opaque.notes)


def test_encrypted_content_round_trip_is_exact():
    text = "Thinking… with unicode ✓, newlines\n\n and \"quotes\""
    token = encode_reasoning(text)
    assert token.startswith(reasoning_token.PREFIX)
    assert decode_reasoning(token) == text
    assert decode_reasoning("gAAAAB-openai-token") is None
    assert decode_reasoning(reasoning_token.PREFIX + "!!!not base64") is None


def test_content_parts():
    req = ad.to_chat({"model": "m", "input": [
        {"role": "system", "content": [{"type": "input_text", "text": "sys"}]},
        {"role": "user", "content": [
            {"type": "input_text", "text": "look"},
            {"type": "input_image", "image_url": "data:image/png;base64,AAAA", "detail": "high"},
            {"type": "input_file", "filename": "a.pdf", "file_data": "data:application/pdf;base64,BBBB"},
        ]},
        {"role": "user", "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]},
    ]})
    assert req.messages[0] == {"role": "system", "content": "sys"}
    assert req.messages[1]["content"] == [
        {"type": "text", "text": "look"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA", "detail": "high"}},
        {"type": "file", "file": {"file_data": "data:application/pdf;base64,BBBB", "filename": "a.pdf"}},
    ]
    # several text parts stay separate parts: the text is never rejoined by us
    assert req.messages[2]["content"] == [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]


def test_tool_choice_and_parameters():
    body = {"model": "m", "input": "x", "tools": [WRITE_FILE, APPLY_PATCH],
            "max_output_tokens": 256, "temperature": 0.2, "top_p": 0.9,
            "text": {"format": {"type": "json_schema", "name": "answer", "strict": True,
                                "schema": {"type": "object", "properties": {"a": {"type": "string"}}}},
                     "verbosity": "low"}}
    req = ad.to_chat({**body, "tool_choice": {"type": "function", "name": "write_file"}})
    assert req.params == {
        "max_tokens": 256, "temperature": 0.2, "top_p": 0.9,
        "tool_choice": {"type": "function", "function": {"name": "write_file"}},
        "response_format": {"type": "json_schema", "json_schema": {
            "name": "answer", "strict": True,
            "schema": {"type": "object", "properties": {"a": {"type": "string"}}}}}}
    custom = ad.to_chat({**body, "tool_choice": {"type": "custom", "name": "apply_patch"}})
    assert custom.params["tool_choice"] == {"type": "function", "function": {"name": "apply_patch"}}
    assert ad.to_chat({**body, "tool_choice": "required"}).params["tool_choice"] == "required"
    allowed = ad.to_chat({**body, "tool_choice": {"type": "allowed_tools", "mode": "required",
                                                  "tools": [{"type": "function", "name": "write_file"}]}})
    assert allowed.params["tool_choice"] == "required"
    no_tools = ad.to_chat({"model": "m", "input": "x", "tool_choice": "required",
                           "tools": [{"type": "web_search"}]})
    assert "tool_choice" not in no_tools.params and no_tools.tools == []
    assert ad.to_chat({"model": "m", "input": "x", "text": {"format": {"type": "json_object"}}}
                      ).params == {"response_format": {"type": "json_object"}}
    none = ad.to_chat({"model": "m", "input": "x", "reasoning": {"effort": "none"}})
    assert none.params["chat_template_kwargs"] == {"reasoning_effort": "none", "enable_thinking": False}


@pytest.mark.parametrize("body, field", [
    ({"input": "x"}, "'model'"),
    ({"model": "m"}, "'input'"),
    ({"model": "m", "input": 5}, "'input'"),
    ({"model": "m", "input": ["text"]}, "'input[0]'"),
    ({"model": "m", "input": [{"role": "robot", "content": "x"}]}, "'input[0].role'"),
    ({"model": "m", "input": [{"type": "function_call", "name": "f", "arguments": "{}"}]},
     "'input[0].call_id'"),
    ({"model": "m", "input": [{"type": "function_call_output", "call_id": "c"}]}, "'input[0].output'"),
    ({"model": "m", "input": [{"type": "custom_tool_call", "call_id": "c", "name": "p"}]},
     "'input[0].input'"),
    ({"model": "m", "input": [{"type": "telepathy"}]}, "'input[0].type'"),
    ({"model": "m", "input": [{"role": "user", "content": [{"type": "input_image", "file_id": "f"}]}]},
     "'input[0].content[0]'"),
    ({"model": "m", "input": [{"role": "user", "content": [{"type": "input_audio"}]}]},
     "'input[0].content[0].type'"),
    ({"model": "m", "input": "x", "tools": [{"type": "function"}]}, "'tools[0].name'"),
    ({"model": "m", "input": "x", "tools": [WRITE_FILE], "tool_choice": {"type": "function", "name": "nope"}},
     "'tool_choice.name'"),
    ({"model": "m", "input": "x", "tools": [WRITE_FILE], "tool_choice": "sometimes"}, "'tool_choice'"),
    ({"model": "m", "input": "x", "max_output_tokens": "many"}, "'max_output_tokens'"),
    ({"model": "m", "input": "x", "text": {"format": {"type": "json_schema", "name": "a"}}},
     "'text.format.schema'"),
    ({"model": "m", "input": "x", "previous_response_id": "resp_1"}, "'previous_response_id'"),
])
def test_bad_input_names_the_field(body, field):
    assert field in invalid(body)


def test_previous_response_id_message_explains():
    message = invalid({"model": "m", "input": "x", "previous_response_id": "resp_1"})
    assert "stateless" in message and "store" in message


def test_server_items_and_references_are_skipped_with_a_note():
    req = ad.to_chat({"model": "m", "input": [
        {"role": "user", "content": "q"},
        {"type": "item_reference", "id": "rs_9"},
        {"type": "web_search_call", "id": "ws_1", "status": "completed"},
        {"role": "assistant", "content": "a"},
    ]})
    assert req.messages == [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    assert len(req.notes) == 2


# ------------------------------------------------------------------ response conversion


def test_text_response_validates_with_sdk_types():
    req = ad.to_chat({"model": "my-model", "input": "hi", "tools": [WRITE_FILE]})
    body = ad.from_chat(result("Hello there."), req)
    parsed = Response.model_validate(body)
    assert parsed.id == req.extra["response_id"] and parsed.object == "response"
    assert parsed.model == "my-model" and parsed.status == "completed"
    assert parsed.output_text == "Hello there."
    message = parsed.output[0]
    assert message.type == "message" and message.id.startswith("msg_") and message.status == "completed"
    assert parsed.usage.input_tokens == 3 and parsed.usage.output_tokens == 2
    assert parsed.usage.total_tokens == 5 and parsed.usage.input_tokens_details.cached_tokens == 0
    assert parsed.tools[0].name == "write_file" and parsed.tool_choice == "auto"


def test_tool_calls_and_custom_tool_calls():
    req = ad.to_chat({"model": "m", "input": "x", "tools": [WRITE_FILE, APPLY_PATCH]})
    patch = "*** Begin Patch\n*** Add File: a.txt\n+hi\n*** End Patch"
    res = result(None, tool_calls=[
        call("write_file", "{\"path\": \"polar.txt\", \"content\": \"x\"}", "call_w"),
        call("apply_patch", json.dumps({"input": patch}), "call_p"),
    ], finish="tool_calls")
    parsed = Response.model_validate(ad.from_chat(res, req))
    assert [o.type for o in parsed.output] == ["function_call", "custom_tool_call"]
    fc, ctc = parsed.output
    assert fc.call_id == "call_w" and fc.name == "write_file" and fc.id.startswith("fc_")
    assert json.loads(fc.arguments) == {"path": "polar.txt", "content": "x"}
    assert ctc.call_id == "call_p" and ctc.name == "apply_patch" and ctc.input == patch


def test_custom_tool_with_unparseable_arguments_keeps_raw_text():
    req = ad.to_chat({"model": "m", "input": "x", "tools": [APPLY_PATCH]})
    body = ad.from_chat(result(None, tool_calls=[call("apply_patch", "*** Begin Patch")]), req)
    assert body["output"][0]["input"] == "*** Begin Patch"


def test_reasoning_item_carries_decodable_encrypted_content():
    req = ad.to_chat({"model": "m", "input": "x", "include": ["reasoning.encrypted_content"]})
    parsed = Response.model_validate(ad.from_chat(result("Answer.", reasoning="Let me think."), req))
    reasoning, message = parsed.output
    assert reasoning.type == "reasoning" and reasoning.id.startswith("rs_")
    assert reasoning.summary[0].text == "Let me think."
    assert decode_reasoning(reasoning.encrypted_content) == "Let me think."
    assert message.type == "message"


def test_length_finish_is_incomplete():
    parsed = Response.model_validate(ad.from_chat(result("cut of", finish="length"),
                                                  ad.to_chat({"model": "m", "input": "x"})))
    assert parsed.status == "incomplete"
    assert parsed.incomplete_details.reason == "max_output_tokens"


def test_empty_answer_still_has_a_message():
    body = ad.from_chat(result(None), ad.to_chat({"model": "m", "input": "x"}))
    assert [o["type"] for o in body["output"]] == ["message"]
    assert body["output"][0]["content"][0]["text"] == ""


def test_output_items_fed_back_reproduce_the_upstream_message():
    """The prefix property: what we answered, sent back as history, is the message the model
    produced (reasoning exact via encrypted_content, tool calls in one turn, same arguments)."""
    tools = [WRITE_FILE, APPLY_PATCH]
    req = ad.to_chat({"model": "m", "input": "do it", "tools": tools})
    upstream = result("I'll write it.", reasoning="Plan: write then patch.\n", tool_calls=[
        call("write_file", "{\"path\": \"polar.txt\", \"content\": \"é\"}", "call_1"),
        call("apply_patch", json.dumps({"input": "*** Begin Patch\n*** End Patch"}, ensure_ascii=False),
             "call_2"),
    ], finish="tool_calls")
    output = ad.from_chat(upstream, req)["output"]
    history = [{"role": "user", "content": "do it"}, *output,
               {"type": "function_call_output", "call_id": "call_1", "output": "ok"},
               {"type": "custom_tool_call_output", "call_id": "call_2", "output": "ok"}]
    again = ad.to_chat({"model": "m", "input": history, "tools": tools})
    assert again.messages[1] == {"role": "assistant", "content": "I'll write it.",
                                 "reasoning": "Plan: write then patch.\n",
                                 "tool_calls": upstream.message["tool_calls"]}


# ------------------------------------------------------------------ streaming through the SDK


def sdk_client(frames: bytes, status: int = 200) -> openai.OpenAI:
    """The real openai client reading our bytes over an in-memory HTTP transport."""
    def handler(request: httpx.Request) -> httpx.Response:
        headers = {"content-type": "text/event-stream" if status == 200 else "application/json"}
        return httpx.Response(status, content=frames, headers=headers)
    return openai.OpenAI(api_key="k", base_url="http://test/v1", max_retries=0,
                         http_client=httpx.Client(transport=httpx.MockTransport(handler)))


def events_of(frames: Iterator[bytes]) -> list[dict[str, Any]]:
    """Parse our SSE frames, checking each `event:` line matches the data's type."""
    out = []
    for frame in b"".join(frames).decode().split("\n\n"):
        if not frame.strip():
            continue
        lines = frame.split("\n")
        assert lines[0].startswith("event: ") and lines[1].startswith("data: ")
        data = json.loads(lines[1][len("data: "):])
        assert lines[0][len("event: "):] == data["type"]
        out.append(data)
    return out


def test_stream_event_order_ids_and_sequence_numbers():
    req = ad.to_chat({"model": "m", "input": "x", "stream": True, "tools": [WRITE_FILE, APPLY_PATCH]})
    text = "Sure — here  is\ttext with  odd   spacing and ünïcode. " * 3
    res = result(text, reasoning="why not", tool_calls=[
        call("write_file", json.dumps({"path": "polar.txt", "content": "y" * 200}), "c1"),
        call("apply_patch", json.dumps({"input": "*** Begin Patch\n*** End Patch"}), "c2")],
        finish="tool_calls")
    events = events_of(ad.stream_events(res, req))
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    types = [e["type"] for e in events]
    assert types[:2] == ["response.created", "response.in_progress"] and types[-1] == "response.completed"
    assert types.count("response.output_item.added") == types.count("response.output_item.done") == 4
    added = {e["output_index"]: e["item"] for e in events if e["type"] == "response.output_item.added"}
    done = {e["output_index"]: e["item"] for e in events if e["type"] == "response.output_item.done"}
    assert [added[i]["id"] for i in range(4)] == [done[i]["id"] for i in range(4)]
    assert [done[i]["type"] for i in range(4)] == ["reasoning", "message", "function_call", "custom_tool_call"]
    deltas = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert deltas == text  # chunking never alters text
    args = "".join(e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta")
    assert args == res.tool_calls[0]["function"]["arguments"]
    patch = "".join(e["delta"] for e in events if e["type"] == "response.custom_tool_call_input.delta")
    assert patch == "*** Begin Patch\n*** End Patch"
    final = events[-1]["response"]
    assert final["id"] == events[0]["response"]["id"] == req.extra["response_id"]
    assert final["output"] == [done[i] for i in range(4)]
    assert decode_reasoning(done[0]["encrypted_content"]) == "why not"


def test_sdk_stream_helper_accepts_our_stream():
    req = ad.to_chat({"model": "m", "input": "x", "stream": True, "tools": [WRITE_FILE]})
    res = result("Writing the file now.", reasoning="think", tool_calls=[
        call("write_file", "{\"path\": \"polar.txt\", \"content\": \"hi\"}", "c1")], finish="tool_calls")
    client = sdk_client(b"".join(ad.stream_events(res, req)))
    with client.responses.stream(model="m", input="x", tools=[WRITE_FILE]) as stream:
        seen = [event.type for event in stream]
        final = stream.get_final_response()
    assert "response.output_text.delta" in seen
    assert final.id == req.extra["response_id"] and final.status == "completed"
    assert final.output_text == "Writing the file now."
    assert [o.type for o in final.output] == ["reasoning", "message", "function_call"]
    assert final.output[2].call_id == "c1"


def test_sdk_raw_stream_parses_every_event_type():
    req = ad.to_chat({"model": "m", "input": "x", "stream": True, "tools": [APPLY_PATCH]})
    res = result(None, reasoning="r", tool_calls=[call("apply_patch", json.dumps({"input": "P"}))],
                 finish="tool_calls")
    client = sdk_client(b"".join(ad.stream_events(res, req)))
    events = list(client.responses.create(model="m", input="x", stream=True))
    kinds = {type(e).__name__ for e in events}
    assert {"ResponseCustomToolCallInputDeltaEvent", "ResponseReasoningSummaryTextDeltaEvent",
            "ResponseCompletedEvent"} <= kinds
    assert events[-1].response.output[-1].input == "P"


def test_stream_of_truncated_answer_still_completes():
    req = ad.to_chat({"model": "m", "input": "x", "stream": True})
    events = events_of(ad.stream_events(result("partial", finish="length"), req))
    assert events[-1]["type"] == "response.completed"
    assert events[-1]["response"]["status"] == "incomplete"
    assert events[-1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}


# ------------------------------------------------------------------ errors


def test_error_response_shapes():
    status, body = ad.error_response(GatewayError("invalid_request", "field 'input' bad"))
    assert status == 400
    assert body == {"error": {"message": "field 'input' bad", "type": "invalid_request_error",
                              "param": None, "code": None}}
    status, body = ad.error_response(GatewayError("context_length", "too long"))
    assert status == 400 and body["error"]["code"] == "context_length_exceeded"
    status, body = ad.error_response(GatewayError("authentication", "unknown key"))
    assert status == 401 and body["error"]["code"] == "invalid_api_key"
    status, body = ad.error_response(GatewayError("upstream_unavailable", "down"))
    assert status == 503 and body["error"]["type"] == "server_error"
    assert ad.error_in_stream(GatewayError("context_length", "x"))
    assert not ad.error_in_stream(GatewayError("upstream_error", "x"))


def test_context_overflow_in_stream_is_response_failed():
    req = ad.to_chat({"model": "m", "input": "x", "stream": True})
    events = events_of(ad.stream_error(GatewayError("context_length", "prompt too long"), req))
    assert [e["type"] for e in events] == ["response.created", "response.in_progress", "error",
                                           "response.failed"]
    assert [e["sequence_number"] for e in events] == [0, 1, 2, 3]
    failed = events[-1]["response"]
    assert failed["id"] == req.extra["response_id"] and failed["status"] == "failed"
    assert failed["error"] == {"code": "context_length_exceeded", "message": "prompt too long"}


def test_sdk_raises_api_error_on_in_stream_failure():
    req = ad.to_chat({"model": "m", "input": "x", "stream": True})
    client = sdk_client(b"".join(ad.stream_error(GatewayError("upstream_error", "upstream died"), req)))
    with pytest.raises(openai.APIError, match="upstream died"):
        list(client.responses.create(model="m", input="x", stream=True))


def test_error_after_started_stream_continues_sequence_and_id():
    """If a stream already began, the failure must not restart numbering or change the id."""
    req = ad.to_chat({"model": "m", "input": "x", "stream": True})
    state = ad._Stream.of(req)
    started = events_of(state.start())
    failure = events_of(ad.stream_error(GatewayError("upstream_timeout", "slow"), req))
    assert [e["type"] for e in failure] == ["error", "response.failed"]
    assert failure[0]["sequence_number"] == started[-1]["sequence_number"] + 1
    assert failure[-1]["response"]["id"] == started[0]["response"]["id"]
    assert failure[-1]["response"]["error"]["code"] == "server_error"


def test_count_tokens_response():
    assert ad.count_tokens_response(42) == {"object": "response.input_tokens", "input_tokens": 42}


# ------------------------------------------------------------------ through the gateway


def gw_client(session: dict[str, Any]) -> openai.OpenAI:
    return openai.OpenAI(base_url=session["base_urls"]["openai"], api_key=session["key"], max_retries=0)


def assert_exact_ids(gateway, rec: dict[str, Any], tools: list[dict[str, Any]] | None = None) -> None:
    """The record's ids are the upstream's own for the same normalised request. Tools are
    rebuilt from the test's own definitions: the /calls JSON has its keys sorted, which changes
    how a template renders the schemas (see the report)."""
    body: dict[str, Any] = {"messages": rec["messages"]}
    if tools:
        body["tools"] = ad.to_chat({"model": "m", "input": "x", "tools": tools}).tools
        assert [t["function"]["name"] for t in rec["tools"]] == [t["function"]["name"] for t in body["tools"]]
    direct = gateway.upstream_chat(body)
    assert rec["prompt_token_ids"] and rec["prompt_token_ids"] == direct["prompt_token_ids"]
    assert rec["completion_token_ids"] and rec["completion_token_ids"] == direct["choices"][0]["token_ids"]
    assert len(rec["completion_logprobs"]) == len(rec["completion_token_ids"])


def sse_events(resp: requests.Response) -> list[dict[str, Any]]:
    """A raw Responses stream read the way Codex reads it: `event:` + `data:` frames."""
    events, kind = [], None
    for line in resp.iter_lines(decode_unicode=True):
        if line.startswith("event: "):
            kind = line[len("event: "):]
        elif line.startswith("data: "):
            data = json.loads(line[len("data: "):])
            assert data["type"] == kind
            events.append(data)
    return events


def test_gateway_non_streaming(gateway, session):
    resp = gw_client(session).responses.create(model="my-policy", instructions="Be brief.", input="hi there")
    assert resp.model == "my-policy" and resp.status == "completed" and resp.id.startswith("resp_")
    assert resp.output_text and resp.usage.output_tokens > 0
    [rec] = gateway.calls(session["session_id"])
    assert rec["provider"] == "openai_responses" and rec["status"] == "ok" and rec["stream"] is False
    assert rec["model_requested"] == "my-policy"
    assert rec["messages"] == [{"role": "system", "content": "Be brief."},
                               {"role": "user", "content": "hi there"}]
    assert rec["response_message"]["content"] == resp.output_text
    assert rec["request"]["input"] == "hi there"
    assert_exact_ids(gateway, rec)


def test_gateway_stream_helper(gateway, session):
    line = "tabs\tand  double  spaces, ünïcödé ✓"
    with gw_client(session).responses.stream(model="my-policy", input=f"polar:say={line}") as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert final.model == "my-policy" and final.status == "completed"
    [rec] = gateway.calls(session["session_id"])
    assert rec["stream"] is True and rec["provider"] == "openai_responses"
    assert "".join(deltas) == final.output_text == rec["response_message"]["content"]
    assert line in final.output_text
    assert_exact_ids(gateway, rec)


def test_gateway_function_tool_round_trip(gateway, session):
    client = gw_client(session)
    history: list[Any] = [{"role": "user", "content": "write the file"}]
    first = client.responses.create(model="m", input=history, tools=[WRITE_FILE])
    [fc] = [o for o in first.output if o.type == "function_call"]
    assert fc.name == "write_file" and json.loads(fc.arguments)["path"] == "polar.txt"
    history += [o.model_dump(exclude_none=True) for o in first.output]
    history.append({"type": "function_call_output", "call_id": fc.call_id, "output": "written"})
    with client.responses.stream(model="m", input=history, tools=[WRITE_FILE]) as stream:
        final = stream.get_final_response()
    assert final.output_text and not [o for o in final.output if o.type == "function_call"]
    first_rec, second_rec = gateway.calls(session["session_id"])
    assert [first_rec["finish_reason"], second_rec["finish_reason"]] == ["tool_calls", "stop"]
    assert second_rec["messages"][-1] == {"role": "tool", "tool_call_id": fc.call_id, "content": "written"}
    # The sampled turn comes back as the same assistant message: the prompt extends the old ids.
    head = first_rec["prompt_token_ids"] + first_rec["completion_token_ids"]
    assert second_rec["prompt_token_ids"][: len(head)] == head
    for rec in (first_rec, second_rec):
        assert_exact_ids(gateway, rec, [WRITE_FILE])


def test_gateway_custom_tool_round_trip(gateway, session):
    client = gw_client(session)
    history: list[Any] = [{"role": "user", "content": "patch it"}]
    first = client.responses.create(model="m", input=history, tools=[APPLY_PATCH])
    [ctc] = [o for o in first.output if o.type == "custom_tool_call"]
    assert ctc.name == "apply_patch" and isinstance(ctc.input, str)
    [first_rec] = gateway.calls(session["session_id"])
    sent = first_rec["response_message"]["tool_calls"][0]["function"]
    assert json.loads(sent["arguments"]) == {"input": ctc.input}
    assert first_rec["tools"][0]["function"]["parameters"]["required"] == ["input"]
    history += [o.model_dump(exclude_none=True) for o in first.output]
    history.append({"type": "custom_tool_call_output", "call_id": ctc.call_id, "output": "Done!"})
    second = client.responses.create(model="m", input=history, tools=[APPLY_PATCH])
    assert "Done!" in second.output_text
    second_rec = gateway.calls(session["session_id"])[1]
    assistant = [m for m in second_rec["messages"] if m["role"] == "assistant"]
    assert assistant[0]["tool_calls"][0]["function"]["name"] == "apply_patch"
    head = first_rec["prompt_token_ids"] + first_rec["completion_token_ids"]
    assert second_rec["prompt_token_ids"][: len(head)] == head


def test_gateway_reasoning_round_trip(gateway, session):
    client = gw_client(session)
    history: list[Any] = [{"role": "user", "content": "explain polar:think"}]
    first = client.responses.create(model="m", input=history, store=False,
                                    include=["reasoning.encrypted_content"])
    [reasoning] = [o for o in first.output if o.type == "reasoning"]
    assert reasoning.encrypted_content and reasoning.summary[0].text
    [first_rec] = gateway.calls(session["session_id"])
    assert reasoning.summary[0].text == first_rec["response_message"]["reasoning"]
    # Clients resend reasoning with the summary stripped; our token alone restores the text.
    history += [{**o.model_dump(exclude_none=True), **({"summary": []} if o.type == "reasoning" else {})}
                for o in first.output]
    history.append({"role": "user", "content": "thanks"})
    client.responses.create(model="m", input=history, store=False)
    second_rec = gateway.calls(session["session_id"])[1]
    assert second_rec["messages"][1]["role"] == "assistant"
    assert second_rec["messages"][1]["reasoning"] == first_rec["response_message"]["reasoning"]
    assert second_rec["messages"][1]["content"] == first.output_text


def test_gateway_codex_shaped_stream(gateway, session):
    body = {
        "model": "gpt-5-codex", "instructions": None, "store": False, "stream": True,
        "include": ["reasoning.encrypted_content"], "tool_choice": "auto", "parallel_tool_calls": False,
        "reasoning": {"effort": "medium", "summary": "auto"}, "prompt_cache_key": "conv-1",
        "tools": [EXEC_COMMAND, APPLY_PATCH, {"type": "web_search"}],
        "input": [
            {"type": "message", "id": "msg_dev", "role": "developer",
             "content": [{"type": "input_text", "text": "You are Codex, a coding agent."}]},
            {"type": "message", "role": "user",
             "content": [{"type": "input_text", "text": "<environment_context>\n  <cwd>/w</cwd>\n</environment_context>"}]},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "list the files"}]},
        ],
    }
    resp = requests.post(f"{session['base_urls']['openai']}/responses", json=body, stream=True, timeout=60,
                         headers={"Authorization": f"Bearer {session['key']}", "Accept": "text/event-stream"})
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/event-stream")
    events = sse_events(resp)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert events[0]["type"] == "response.created" and events[-1]["type"] == "response.completed"
    done = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    calls = [i for i in done if i["type"] == "function_call"]
    assert calls and calls[0]["name"] == "exec_command" and json.loads(calls[0]["arguments"])
    completed = events[-1]["response"]
    assert isinstance(completed["id"], str) and completed["model"] == "gpt-5-codex"
    assert completed["output"] == done
    [rec] = gateway.calls(session["session_id"])
    assert rec["messages"][0] == {"role": "system", "content": "You are Codex, a coding agent."}
    assert [t["function"]["name"] for t in rec["tools"]] == ["exec_command", "apply_patch"]
    assert rec["request"]["store"] is False
    assert_exact_ids(gateway, rec, body["tools"])


def test_gateway_context_overflow(gateway, session):
    """Prompt + max_output_tokens beyond the upstream's context window, whatever its size."""
    huge = 10**8
    with pytest.raises(openai.BadRequestError) as exc:
        gw_client(session).responses.create(model="m", input="hi", max_output_tokens=huge)
    assert exc.value.response.json()["error"]["code"] == "context_length_exceeded"
    resp = requests.post(f"{session['base_urls']['openai']}/responses", stream=True, timeout=60,
                         json={"model": "m", "input": "hi", "max_output_tokens": huge, "stream": True},
                         headers={"Authorization": f"Bearer {session['key']}"})
    assert resp.status_code == 200
    events = sse_events(resp)
    assert events[0]["type"] == "response.created" and events[-1]["type"] == "response.failed"
    assert events[-1]["response"]["error"]["code"] == "context_length_exceeded"
    assert [r["status"] for r in gateway.calls(session["session_id"])] == ["error", "error"]


def test_gateway_rejects_stateless_violations_and_unknown_keys(gateway, session):
    with pytest.raises(openai.BadRequestError) as exc:
        gw_client(session).responses.create(model="m", input="x", previous_response_id="resp_abc")
    assert "previous_response_id" in exc.value.response.json()["error"]["message"]
    bad = openai.OpenAI(base_url=f"{gateway.url}/s/pmq-nope/v1", api_key="pmq-nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as auth:
        bad.responses.create(model="m", input="x")
    assert set(auth.value.response.json()["error"]) >= {"message", "type", "code"}
    assert gateway.calls(session["session_id"]) == []


def test_gateway_input_tokens_route_records_nothing(gateway, session):
    resp = requests.post(f"{session['base_urls']['openai']}/responses/input_tokens", timeout=30,
                         json={"model": "m", "input": "count these words please"})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["object"] == "response.input_tokens" and body["input_tokens"] > 0
    assert gateway.calls(session["session_id"]) == []
