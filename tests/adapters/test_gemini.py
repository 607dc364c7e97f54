"""The Gemini adapter: request conversion, responses checked by google-genai's own types and parser,
the real google-genai client talking to the adapter in-process, and (when the gateway fixtures
exist) the real gateway end to end."""

from __future__ import annotations

import base64
import copy
import json
import re
from typing import Any
from urllib.parse import urlparse, parse_qs

import httpx2
import pytest
import requests
from google import genai
from google.genai import errors as genai_errors
from google.genai import types

from polar_mq.proxy_app.adapters import gemini
from polar_mq.proxy_app.adapters.base import ChatRequest, ChatResult, GatewayError
from polar_mq.proxy_app.adapters.reasoning import decode_reasoning


# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------

def _bad(body: Any, *needles: str) -> GatewayError:
    """to_chat must refuse `body` with a 400 whose message names every needle."""
    with pytest.raises(GatewayError) as info:
        gemini.to_chat(body)
    err = info.value
    assert err.kind == "invalid_request" and err.status == 400
    for needle in needles:
        assert needle in err.message, err.message
    return err


def _result(content: str | None = "", *, reasoning: str | None = None,
            tool_calls: list[dict] | None = None, finish: str = "stop",
            prompt_tokens: int = 11, completion_tokens: int = 7, raw: dict | None = None) -> ChatResult:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if reasoning is not None:
        message["reasoning"] = reasoning
    if tool_calls:
        message["tool_calls"] = tool_calls
    return ChatResult(id="chatcmpl-abc123", model="served-model", message=message,
                      finish_reason=finish, prompt_token_ids=[1, 2, 3], completion_token_ids=[4, 5],
                      logprobs=[-0.1, -0.2], prompt_tokens=prompt_tokens,
                      completion_tokens=completion_tokens, raw=raw or {})


def _call(call_id: str, name: str, args: dict) -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


def _req(model: str = "gemini-2.5-pro", **extra: Any) -> ChatRequest:
    return ChatRequest(model=model, messages=[{"role": "user", "content": "hi"}], extra=extra)


def _sse_frames(raw: bytes, comments: bool = False) -> list[dict]:
    """Frames of an SSE body, asserting it is `data:` lines only (no event lines, no [DONE]);
    with `comments`, keep-alive comment frames (": ping") are allowed and skipped."""
    text = raw.decode()
    assert text.endswith("\n\n")
    frames = []
    for block in text.split("\n\n")[:-1]:
        if comments and block.startswith(":"):
            continue
        lines = block.split("\n")
        assert len(lines) == 1 and lines[0].startswith("data: "), block
        assert lines[0] != "data: [DONE]"
        frames.append(json.loads(lines[0][len("data: "):]))
    return frames


def _sdk_segments(raw: bytes) -> list[types.GenerateContentResponse]:
    """Parse a streamed body with google-genai's own SSE reader and response type."""
    from google.genai._api_client import HttpResponse
    response = httpx2.Response(200, headers={"content-type": "text/event-stream"}, content=raw)
    http = HttpResponse(dict(response.headers), response_stream=response)
    return [types.GenerateContentResponse._from_response(response=seg, kwargs={})
            for seg in http.segments()]


# A Gemini-CLI-shaped second-turn body: system instruction, several user text parts, a model turn
# with a thought part and a functionCall carrying an id and a signature, then the functionResponse.
GEMINI_CLI_BODY: dict[str, Any] = {
    "contents": [
        {"role": "user", "parts": [{"text": "This is the Gemini CLI. Today's date is ..."},
                                   {"text": "Create polar.txt containing hello"}]},
        {"role": "model", "parts": [
            {"text": "I should write the file.", "thought": True},
            {"functionCall": {"id": "write_file-1730000000000-abc", "name": "write_file",
                              "args": {"file_path": "polar.txt", "content": "hello"}},
             "thoughtSignature": "skip_thought_signature_validator"},
        ]},
        {"role": "user", "parts": [
            {"functionResponse": {"id": "write_file-1730000000000-abc", "name": "write_file",
                                  "response": {"output": "Successfully created polar.txt"}}},
        ]},
    ],
    "systemInstruction": {"role": "user", "parts": [{"text": "You are an interactive CLI agent."}]},
    "tools": [{"functionDeclarations": [
        {"name": "write_file", "description": "Writes a file.",
         "parametersJsonSchema": {"type": "object",
                                  "properties": {"file_path": {"type": "string"},
                                                 "content": {"type": "string"}},
                                  "required": ["file_path", "content"]}},
        {"name": "list_directory", "description": "Lists a directory.",
         "parametersJsonSchema": {"type": "object", "properties": {"dir_path": {"type": "string"}}}},
    ]}],
    "generationConfig": {"temperature": 0, "topP": 1,
                         "thinkingConfig": {"includeThoughts": True, "thinkingBudget": 8192}},
}


# ---------------------------------------------------------------------------------------------
# request conversion
# ---------------------------------------------------------------------------------------------

def test_gemini_cli_body_converts_to_chat():
    req = gemini.to_chat(copy.deepcopy(GEMINI_CLI_BODY))
    assert req.model == ""  # the gateway fills it in from the URL
    assert req.messages == [
        {"role": "system", "content": "You are an interactive CLI agent."},
        {"role": "user", "content": [
            {"type": "text", "text": "This is the Gemini CLI. Today's date is ..."},
            {"type": "text", "text": "Create polar.txt containing hello"}]},
        {"role": "assistant", "content": None, "reasoning": "I should write the file.",
         "tool_calls": [{"id": "write_file-1730000000000-abc", "type": "function",
                         "function": {"name": "write_file",
                                      "arguments": json.dumps({"file_path": "polar.txt",
                                                               "content": "hello"})}}]},
        {"role": "tool", "tool_call_id": "write_file-1730000000000-abc",
         "content": "Successfully created polar.txt"},
    ]
    assert [t["function"]["name"] for t in req.tools] == ["write_file", "list_directory"]
    # parametersJsonSchema is taken as is
    assert req.tools[0]["function"]["parameters"] == \
        GEMINI_CLI_BODY["tools"][0]["functionDeclarations"][0]["parametersJsonSchema"]
    assert req.params == {"temperature": 0, "top_p": 1,
                          "chat_template_kwargs": {"enable_thinking": True}}
    assert any("enable_thinking=True" in n for n in req.notes)
    assert req.extra["include_thoughts"] is True


def test_snake_case_body_and_generated_ids_are_unique_and_matched_in_order():
    body = {
        "model": "models/gemini-2.5-flash",
        "system_instruction": {"parts": [{"text": "be brief"}, {"text": "be right"}]},
        "contents": [
            {"role": "user", "parts": [{"text": "read a and b"}]},
            {"role": "model", "parts": [
                {"function_call": {"name": "read", "args": {"path": "a"}}},
                {"function_call": {"name": "read", "args": {"path": "b"}}},
                {"function_call": {"name": "stat", "args": {}}},
            ]},
            {"role": "user", "parts": [
                {"function_response": {"name": "stat", "response": {"size": 3}}},
                {"function_response": {"name": "read", "response": {"result": "A"}}},
                {"function_response": {"name": "read", "response": {"result": "B"}}},
                {"text": "thanks"},
            ]},
        ],
        "tools": [{"function_declarations": [
            {"name": "read", "parameters_json_schema": {"type": "object",
                                                         "properties": {"path": {"type": "string"}}}},
            {"name": "stat"},
        ]}],
    }
    req = gemini.to_chat(body)
    assert req.model == "gemini-2.5-flash"
    assert req.messages[0] == {"role": "system", "content": "be brief\nbe right"}
    calls = req.messages[2]["tool_calls"]
    ids = [c["id"] for c in calls]
    assert len(set(ids)) == 3, ids  # same name twice -> two distinct ids
    tool_msgs = req.messages[3:6]
    assert [m["role"] for m in tool_msgs] == ["tool"] * 3
    # stat answered first but matched to the stat call; the two reads in call order
    assert [(m["tool_call_id"], m["content"]) for m in tool_msgs] == [
        (ids[2], '{"size": 3}'), (ids[0], "A"), (ids[1], "B")]
    assert req.messages[6] == {"role": "user", "content": "thanks"}
    assert req.tools[0]["function"]["parameters"]["properties"]["path"] == {"type": "string"}
    assert req.tools[1]["function"]["parameters"] == {"type": "object", "properties": {}}
    # replaying the same history gives the same ids (the prompt stays a prefix of the next one)
    assert gemini.to_chat(copy.deepcopy(body)).messages == req.messages


def test_ai_sdk_shaped_body_opencode():
    """@ai-sdk/google (opencode): lower-case OpenAPI schemas, calls without ids, tool results
    wrapped as {name, content}."""
    body = {
        "generationConfig": {"maxOutputTokens": 32000, "thinkingConfig": {"includeThoughts": True}},
        "contents": [
            {"role": "user", "parts": [{"text": "list files"}]},
            {"role": "model", "parts": [
                {"text": "Planning.", "thought": True, "thoughtSignature": "b3BhcXVl"},
                {"functionCall": {"name": "bash", "args": {"command": "ls"}}}]},
            {"role": "user", "parts": [{"functionResponse": {
                "name": "bash", "response": {"name": "bash", "content": "polar.txt\n"}}}]},
        ],
        "systemInstruction": {"parts": [{"text": "You are opencode."}]},
        "tools": [{"functionDeclarations": [{
            "name": "bash", "description": "run a command",
            "parameters": {"type": "object", "required": ["command"],
                           "properties": {"command": {"type": "string"},
                                          "timeout": {"type": "number", "nullable": True}}}}]}],
    }
    req = gemini.to_chat(body)
    call_id = req.messages[2]["tool_calls"][0]["id"]
    assert call_id and req.messages[2]["reasoning"] == "Planning."
    assert req.messages[3] == {"role": "tool", "tool_call_id": call_id, "content": "polar.txt\n"}
    assert req.tools[0]["function"]["parameters"]["properties"]["timeout"] == {"type": ["number", "null"]}
    assert req.params == {"max_tokens": 32000, "chat_template_kwargs": {"enable_thinking": True}}


def test_openapi_schema_becomes_json_schema():
    schema = {
        "type": "OBJECT",
        "properties": {
            "type": {"type": "STRING", "enum": ["a", "b"]},  # a property literally named "type"
            "tags": {"type": "ARRAY", "items": {"type": "STRING"}, "minItems": 1},
            "limit": {"type": "INTEGER", "nullable": True, "format": "int32"},
            "nested": {"type": "OBJECT", "properties": {"x": {"type": "NUMBER"}},
                       "propertyOrdering": ["x"], "required": ["x"]},
            "either": {"anyOf": [{"type": "STRING"}, {"type": "BOOLEAN"}]},
            "dir_path": {"type": "STRING", "max_length": 9},  # names are data, keywords may be snake
        },
        "required": ["type", "dir_path"],
        "propertyOrdering": ["type", "tags", "limit", "nested", "either"],
    }
    body = {"contents": [{"role": "user", "parts": [{"text": "x"}]}],
            "tools": [{"functionDeclarations": [{"name": "f", "parameters": schema}]}]}
    params = gemini.to_chat(body).tools[0]["function"]["parameters"]
    assert params == {
        "type": "object",
        "properties": {
            "type": {"type": "string", "enum": ["a", "b"]},
            "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1},
            "limit": {"type": ["integer", "null"], "format": "int32"},
            "nested": {"type": "object", "properties": {"x": {"type": "number"}}, "required": ["x"]},
            "either": {"anyOf": [{"type": "string"}, {"type": "boolean"}]},
            "dir_path": {"type": "string", "maxLength": 9},
        },
        "required": ["type", "dir_path"],
    }


def test_server_tools_are_dropped_and_noted():
    body = {"contents": [{"parts": [{"text": "search"}]}],
            "tools": [{"googleSearch": {}}, {"codeExecution": {}}, {"url_context": {}},
                      {"functionDeclarations": [{"name": "f"}]}]}
    req = gemini.to_chat(body)
    assert [t["function"]["name"] for t in req.tools] == ["f"]
    for name in ("googleSearch", "codeExecution", "urlContext"):
        assert f"dropped server tool {name}" in req.notes


@pytest.mark.parametrize("config, choice", [
    ({"mode": "AUTO"}, "auto"),
    ({"mode": "NONE"}, "none"),
    ({"mode": "ANY"}, "required"),
    ({"mode": "ANY", "allowedFunctionNames": ["g"]}, {"type": "function", "function": {"name": "g"}}),
    ({"mode": "MODE_UNSPECIFIED"}, None),
])
def test_function_calling_config_maps_to_tool_choice(config, choice):
    body = {"contents": [{"parts": [{"text": "x"}]}],
            "tools": [{"functionDeclarations": [{"name": "f"}, {"name": "g"}]}],
            "toolConfig": {"functionCallingConfig": config}}
    assert gemini.to_chat(body).params.get("tool_choice") == choice


def test_generation_config_maps_to_chat_params():
    body = {"contents": [{"parts": [{"text": "x"}]}],
            "generationConfig": {"maxOutputTokens": 256, "temperature": 0.5, "topP": 0.9, "topK": 40,
                                 "stopSequences": ["END"], "seed": 7, "candidateCount": 1,
                                 "presencePenalty": 0.1, "frequencyPenalty": 0.2,
                                 "responseMimeType": "application/json",
                                 "responseSchema": {"type": "OBJECT",
                                                    "properties": {"n": {"type": "INTEGER"}}},
                                 "thinkingConfig": {"thinkingBudget": 0}}}
    params = gemini.to_chat(body).params
    assert params == {
        "max_tokens": 256, "temperature": 0.5, "top_p": 0.9, "top_k": 40, "stop": ["END"],
        "seed": 7, "presence_penalty": 0.1, "frequency_penalty": 0.2,
        "response_format": {"type": "json_schema", "json_schema": {
            "name": "response", "schema": {"type": "object", "properties": {"n": {"type": "integer"}}}}},
        "chat_template_kwargs": {"enable_thinking": False},
    }


def test_response_json_schema_is_used_as_is_and_plain_json_mode():
    schema = {"type": "object", "properties": {"a": {"type": "string"}}, "additionalProperties": False}
    body = {"contents": [{"parts": [{"text": "x"}]}],
            "generation_config": {"response_mime_type": "application/json",
                                  "response_json_schema": schema}}
    rf = gemini.to_chat(body).params["response_format"]
    assert rf == {"type": "json_schema", "json_schema": {"name": "response", "schema": schema}}
    body = {"contents": [{"parts": [{"text": "x"}]}],
            "generationConfig": {"responseMimeType": "application/json"}}
    assert gemini.to_chat(body).params["response_format"] == {"type": "json_object"}


def test_images_become_image_url_parts():
    png = base64.b64encode(b"\x89PNG fake").decode()
    body = {"contents": [{"role": "user", "parts": [
        {"text": "what is this?"},
        {"inlineData": {"mimeType": "image/png", "data": png}},
        {"file_data": {"mime_type": "image/jpeg", "file_uri": "https://example.com/cat.jpg"}},
        {"inlineData": {"mimeType": "application/pdf", "data": "JVBERi0="}},
    ]}]}
    req = gemini.to_chat(body)
    assert req.messages == [{"role": "user", "content": [
        {"type": "text", "text": "what is this?"},
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{png}"}},
        {"type": "image_url", "image_url": {"url": "https://example.com/cat.jpg"}},
    ]}]
    assert "dropped inlineData of type application/pdf" in req.notes


def test_count_tokens_bodies():
    inner = {"model": "models/m", "contents": [{"parts": [{"text": "hi"}]}]}
    assert gemini.count_request_body({"generateContentRequest": inner}) == inner
    assert gemini.count_request_body({"generate_content_request": inner}) == inner
    plain = {"contents": [{"parts": [{"text": "hi"}]}]}
    # the model is in the URL: a count body gets a placeholder, so to_chat needs nothing else
    assert gemini.count_request_body(plain) == {"model": "count", **plain}
    assert gemini.to_chat(gemini.count_request_body({"generateContentRequest": inner})).model == "m"
    assert gemini.count_tokens_response(42) == {"totalTokens": 42}
    assert types.CountTokensResponse.model_validate(gemini.count_tokens_response(42)).total_tokens == 42


@pytest.mark.parametrize("body, needles", [
    ([], ["JSON object"]),
    ({}, ["'contents'"]),
    ({"contents": "hi"}, ["'contents'", "array"]),
    ({"contents": []}, ["'contents'", "empty"]),
    ({"contents": [{"role": "user"}]}, ["'contents[0].parts'"]),
    ({"contents": [{"role": "user", "parts": ["hi"]}]}, ["'contents[0].parts[0]'"]),
    ({"contents": [{"parts": [{"text": "a"}]}, {"role": "assistant", "parts": [{"text": "b"}]}]},
     ["'contents[1].role'"]),
    ({"contents": [{"role": "model", "parts": [{"functionCall": {"args": {}}}]}]},
     ["'contents[0].parts[0].functionCall.name'"]),
    ({"contents": [{"role": "model", "parts": [{"functionCall": {"name": "f", "args": "x"}}]}]},
     ["'contents[0].parts[0].functionCall.args'"]),
    ({"contents": [{"parts": [{"functionResponse": {"name": "f", "response": "ok"}}]}]},
     ["'contents[0].parts[0].functionResponse.response'"]),
    ({"contents": [{"parts": [{"text": 5}]}]}, ["'contents[0].parts[0].text'", "string"]),
    ({"contents": [{"parts": [{"text": "x"}]}], "generationConfig": {"candidateCount": 2}},
     ["'generationConfig.candidateCount'"]),
    ({"contents": [{"parts": [{"text": "x"}]}], "generationConfig": {"maxOutputTokens": "9"}},
     ["'generationConfig.maxOutputTokens'", "integer"]),
    ({"contents": [{"parts": [{"text": "x"}]}], "generationConfig": {"temperature": True}},
     ["'generationConfig.temperature'"]),
    ({"contents": [{"parts": [{"text": "x"}]}], "tools": [{"functionDeclarations": [{}]}]},
     ["'tools[0].functionDeclarations[0].name'"]),
    ({"contents": [{"parts": [{"text": "x"}]}], "tools": {"functionDeclarations": []}},
     ["'tools'", "array"]),
    ({"contents": [{"parts": [{"text": "x"}]}],
      "toolConfig": {"functionCallingConfig": {"mode": "SOMETIMES"}}},
     ["'toolConfig.functionCallingConfig.mode'"]),
    ({"contents": [{"parts": [{"inlineData": {"mimeType": "image/png"}}]}]},
     ["'contents[0].parts[0].inlineData.data'"]),
    ({"contents": [{"parts": [{"text": "x"}]}], "systemInstruction": 3}, ["'systemInstruction'"]),
])
def test_bad_requests_name_the_field(body, needles):
    _bad(body, *needles)


# ---------------------------------------------------------------------------------------------
# responses
# ---------------------------------------------------------------------------------------------

def test_text_response_validates_with_sdk_types():
    body = gemini.from_chat(_result("Hello there."), _req("gemini-2.5-pro"))
    resp = types.GenerateContentResponse.model_validate(body)
    assert resp.text == "Hello there."
    cand = resp.candidates[0]
    assert cand.content.role == "model" and cand.finish_reason == types.FinishReason.STOP
    assert cand.index == 0
    assert resp.model_version == "gemini-2.5-pro"  # requested, not served
    assert resp.response_id == "chatcmpl-abc123"
    assert resp.usage_metadata.prompt_token_count == 11
    assert resp.usage_metadata.candidates_token_count == 7
    assert resp.usage_metadata.total_token_count == 18


def test_tool_call_response_has_whole_function_calls_and_stop():
    result = _result(None, tool_calls=[_call("chatcmpl-tool-1", "write_file", {"path": "polar.txt"}),
                                       _call("chatcmpl-tool-2", "write_file", {"path": "b.txt"})],
                     finish="tool_calls")
    resp = types.GenerateContentResponse.model_validate(gemini.from_chat(result, _req()))
    assert resp.candidates[0].finish_reason == types.FinishReason.STOP
    calls = resp.function_calls
    assert [(c.id, c.name, c.args) for c in calls] == [
        ("chatcmpl-tool-1", "write_file", {"path": "polar.txt"}),
        ("chatcmpl-tool-2", "write_file", {"path": "b.txt"})]


def test_length_maps_to_max_tokens_and_reasoning_tokens_are_split():
    raw = {"usage": {"completion_tokens_details": {"reasoning_tokens": 3}}}
    result = _result("trunc", reasoning="hmm", finish="length", raw=raw)
    resp = types.GenerateContentResponse.model_validate(gemini.from_chat(result, _req()))
    assert resp.candidates[0].finish_reason == types.FinishReason.MAX_TOKENS
    usage = resp.usage_metadata
    assert (usage.candidates_token_count, usage.thoughts_token_count, usage.total_token_count) == (4, 3, 18)


def test_thought_signature_round_trips_reasoning_even_without_thought_parts():
    reasoning = "Let me think… about ünïcode and \"quotes\"\n  and spacing."
    result = _result("Done.", reasoning=reasoning,
                     tool_calls=[_call("chatcmpl-tool-9", "write_file", {"path": "polar.txt"})],
                     finish="tool_calls")
    body = gemini.from_chat(result, _req())
    parts = body["candidates"][0]["content"]["parts"]
    assert parts[0] == {"text": reasoning, "thought": True}
    assert parts[1] == {"text": "Done."}
    assert "thoughtSignature" in parts[2] and "functionCall" in parts[2]  # on the first call
    # The SDK decodes the signature to bytes and re-encodes it (URL-safe) when sending history.
    content = types.GenerateContentResponse.model_validate(body).candidates[0].content
    wire = json.loads(json.dumps(content.model_dump(mode="json", by_alias=True, exclude_none=True)))
    stripped = {"role": "model", "parts": [p for p in wire["parts"] if not p.get("thought")]}
    for history in (wire, stripped):
        msgs = gemini.to_chat({"contents": [{"role": "user", "parts": [{"text": "go"}]}, history]}).messages
        assert msgs[1]["reasoning"] == reasoning
        assert msgs[1]["content"] == "Done."
        assert msgs[1]["tool_calls"][0]["id"] == "chatcmpl-tool-9"


def test_foreign_signatures_are_ignored_and_thought_parts_used():
    assert decode_reasoning("skip_thought_signature_validator") is None
    assert decode_reasoning(base64.b64encode(b"google-opaque").decode()) is None
    body = {"contents": [{"role": "model", "parts": [
        {"text": "part one, ", "thought": True, "thoughtSignature": "c2lnbmF0dXJl"},
        {"text": "part two", "thought": True}, {"text": "answer"}]}]}
    msg = gemini.to_chat(body).messages[0]
    assert msg == {"role": "assistant", "content": "answer", "reasoning": "part one, part two"}


def test_thoughts_hidden_when_client_turned_them_off_but_signature_still_carried():
    req = _req(include_thoughts=False)
    body = gemini.from_chat(_result("", reasoning="secret plan"), req)
    parts = body["candidates"][0]["content"]["parts"]
    assert not any(p.get("thought") for p in parts)
    assert decode_reasoning(parts[0]["thoughtSignature"]) == "secret plan"


TRICKY = "  Leading spaces,\n\ttabs, émoji 🎉🎉, CRLF\r\n and a long tail " + "x" * 100 + "  "


def test_sse_stream_frames_are_whole_responses_and_text_is_unaltered():
    result = _result(TRICKY, reasoning="r" * 70,
                     tool_calls=[_call("chatcmpl-tool-1", "write_file", {"path": "polar.txt", "n": 1}),
                                 _call("chatcmpl-tool-2", "list_directory", {})],
                     finish="tool_calls")
    raw = b"".join(gemini.stream_events(result, _req("gemini-x", alt="sse")))
    frames = _sse_frames(raw)
    assert len(frames) > 4
    for frame in frames[:-1]:
        assert "finishReason" not in frame["candidates"][0] and "usageMetadata" not in frame
    last = frames[-1]
    assert last["candidates"][0]["finishReason"] == "STOP"
    assert last["usageMetadata"]["totalTokenCount"] == 18
    assert {f["modelVersion"] for f in frames} == {"gemini-x"}
    assert {f["responseId"] for f in frames} == {"chatcmpl-abc123"}
    # The SDK's own SSE reader and types accept every frame.
    parsed = _sdk_segments(raw)
    parts = [p for r in parsed for p in r.candidates[0].content.parts]
    text = "".join(p.text for p in parts if p.text is not None and not p.thought)
    thought = "".join(p.text for p in parts if p.thought)
    assert text == TRICKY and thought == "r" * 70
    calls = [p.function_call for p in parts if p.function_call]
    assert [(c.id, c.name, c.args) for c in calls] == [
        ("chatcmpl-tool-1", "write_file", {"path": "polar.txt", "n": 1}),
        ("chatcmpl-tool-2", "list_directory", {})]
    assert parts[-2].thought_signature  # on the first function call


def test_json_array_stream_without_alt_sse():
    req = _req(alt=None)
    raw = gemini.stream_ping(req) + b"".join(gemini.stream_events(_result(TRICKY), req))
    frames = json.loads(raw)
    assert isinstance(frames, list) and len(frames) > 1
    assert "".join(f["candidates"][0]["content"]["parts"][0]["text"] for f in frames) == TRICKY
    assert gemini.stream_content_type(req) == "application/json"
    assert gemini.stream_content_type(_req(alt="sse")) == "text/event-stream"


def test_empty_answer_streams_one_final_frame():
    frames = _sse_frames(b"".join(gemini.stream_events(_result(""), _req(alt="sse"))))
    assert len(frames) == 1
    assert frames[0]["candidates"][0]["finishReason"] == "STOP"
    types.GenerateContentResponse.model_validate(frames[0])


@pytest.mark.parametrize("kind, status, name", [
    ("invalid_request", 400, "INVALID_ARGUMENT"),
    ("authentication", 401, "UNAUTHENTICATED"),
    ("not_found", 404, "NOT_FOUND"),
    ("rate_limit", 429, "RESOURCE_EXHAUSTED"),
    ("upstream_unavailable", 503, "UNAVAILABLE"),
    ("upstream_timeout", 504, "DEADLINE_EXCEEDED"),
    ("internal", 500, "INTERNAL"),
])
def test_error_shapes(kind, status, name):
    code, body = gemini.error_response(GatewayError(kind, "boom"))
    assert code == status
    assert body == {"error": {"code": status, "message": "boom", "status": name}}
    assert gemini.error_in_stream(GatewayError(kind, "boom")) is False


def test_context_overflow_is_a_400_with_googles_message():
    err = GatewayError("context_length", "This model's maximum context length is 2048 tokens...",
                       detail={"prompt_tokens": 5000, "max_model_len": 2048})
    code, body = gemini.error_response(err)
    assert code == 400
    assert body["error"] == {
        "code": 400, "status": "INVALID_ARGUMENT",
        "message": "The input token count (5000) exceeds the maximum number of tokens allowed (2048)."}
    # without the numbers, the upstream's own message
    code, body = gemini.error_response(GatewayError("context_length", "too long"))
    assert (code, body["error"]["message"]) == (400, "too long")


def _sdk_stream_over(body: bytes) -> list[types.GenerateContentResponse]:
    """Run google-genai's generate_content_stream over a canned 200 SSE body."""
    transport = httpx2.MockTransport(lambda request: httpx2.Response(
        200, headers={"content-type": "text/event-stream"}, content=body))
    client = genai.Client(api_key="k", http_options=types.HttpOptions(
        base_url="http://gateway.test", httpx_client=httpx2.Client(transport=transport)))
    return list(client.models.generate_content_stream(model="m", contents="hi"))


def test_keepalive_is_safe_for_google_genai_where_an_sse_comment_is_not():
    from polar_mq.proxy_app.adapters.base import PING
    req = _req(alt="sse")
    frames = b"".join(gemini.stream_events(_result("pong"), req))
    ping = gemini.stream_ping(req)
    chunks = _sdk_stream_over(ping + ping + frames)
    assert "".join(c.text or "" for c in chunks) == "pong"
    # the reason stream_ping exists: google-genai reads ": ping" as a raw JSON chunk
    with pytest.raises(genai_errors.UnknownApiResponseError):
        _sdk_stream_over(PING + frames)


def test_stream_error_is_raised_by_the_sdk():
    err = GatewayError("upstream_unavailable", "upstream down")
    raw = b"".join(gemini.stream_error(err, _req(alt="sse")))
    # a bare JSON chunk: what @google/genai (JS) checks with JSON.parse(chunk)
    assert json.loads(raw) == {"error": {"code": 503, "message": "upstream down",
                                         "status": "UNAVAILABLE"}}
    assert json.loads(b"".join(gemini.stream_error(err, _req(alt=None))))[0]["error"]["code"] == 503
    # after keep-alives and a 200, google-genai's streaming reader raises it
    with pytest.raises(genai_errors.APIError) as info:
        _sdk_stream_over(gemini.stream_ping(_req(alt="sse")) + raw)
    assert (info.value.code, info.value.status) == (503, "UNAVAILABLE")


# ---------------------------------------------------------------------------------------------
# the real google-genai client against the adapter, in-process
# ---------------------------------------------------------------------------------------------

_ROUTE = re.compile(r"/(v1beta|v1)/models/([^/:]+):(generateContent|streamGenerateContent|countTokens)$")


class Loopback:
    """An httpx2 transport that serves Gemini routes with the adapter and a scripted model:
    with tools and no tool result yet it calls the first tool; otherwise it answers text.
    `polar:think` in the last user text adds reasoning."""

    def __init__(self) -> None:
        self.seen: list[ChatRequest] = []
        self.paths: list[str] = []

    def model(self, req: ChatRequest) -> ChatResult:
        last = req.messages[-1]
        user_text = json.dumps([m.get("content") for m in req.messages if m["role"] == "user"][-1:])
        reasoning = "thinking hard" if "polar:think" in user_text else None
        if req.tools and last["role"] != "tool":
            name = req.tools[0]["function"]["name"]
            return _result(None, reasoning=reasoning, finish="tool_calls",
                           tool_calls=[_call(f"chatcmpl-tool-{len(self.seen)}", name, {"path": "polar.txt"})])
        return _result("All done.", reasoning=reasoning)

    def __call__(self, request: httpx2.Request) -> httpx2.Response:
        url = urlparse(str(request.url))
        self.paths.append(url.path)
        match = _ROUTE.search(url.path)
        assert match, url.path
        _, model, method = match.groups()
        body = json.loads(request.content or b"{}")
        try:
            if method == "countTokens":
                req = gemini.to_chat(gemini.count_request_body(body))
                return httpx2.Response(200, json=gemini.count_tokens_response(
                    sum(len(json.dumps(m)) // 4 for m in req.messages)))
            req = gemini.to_chat(body)
        except GatewayError as err:
            status, payload = gemini.error_response(err)
            return httpx2.Response(status, json=payload)
        req.model = req.model or model
        self.seen.append(req)
        result = self.model(req)
        if method == "generateContent":
            return httpx2.Response(200, json=gemini.from_chat(result, req))
        req.extra["alt"] = (parse_qs(url.query).get("alt") or [None])[0]
        content = b"".join(gemini.stream_events(result, req))
        return httpx2.Response(200, headers={"content-type": gemini.stream_content_type(req)},
                               content=content)


@pytest.fixture(params=["v1beta", "v1"])
def loopback(request):
    server = Loopback()
    client = genai.Client(api_key="test-key", http_options=types.HttpOptions(
        base_url="http://gateway.test/s/k", api_version=request.param,
        httpx_client=httpx2.Client(transport=httpx2.MockTransport(server))))
    return client, server, request.param


def test_sdk_generate_and_stream(loopback):
    client, server, version = loopback
    resp = client.models.generate_content(model="gemini-2.5-flash", contents="hello")
    assert resp.text == "All done."
    assert resp.model_version == "gemini-2.5-flash"
    chunks = list(client.models.generate_content_stream(model="gemini-2.5-flash", contents="hello"))
    assert "".join(c.text or "" for c in chunks) == "All done."
    assert chunks[-1].candidates[0].finish_reason == types.FinishReason.STOP
    assert all(p.startswith(f"/s/k/{version}/models/") for p in server.paths)


def test_sdk_function_calling_round_trip(loopback):
    client, server, _ = loopback
    write = types.FunctionDeclaration(
        name="write_file", description="write a file",
        parameters=types.Schema(type="OBJECT", properties={"path": types.Schema(type="STRING")},
                                required=["path"]))
    config = types.GenerateContentConfig(
        tools=[types.Tool(function_declarations=[write])],
        automatic_function_calling=types.AutomaticFunctionCallingConfig(disable=True))
    history = [types.Content(role="user", parts=[types.Part(text="write polar.txt")])]
    first = client.models.generate_content(model="gemini-2.5-flash", contents=history, config=config)
    call = first.function_calls[0]
    assert (call.name, call.args) == ("write_file", {"path": "polar.txt"})
    assert server.seen[0].tools[0]["function"]["parameters"] == {
        "type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}
    history += [first.candidates[0].content,
                types.Content(role="user", parts=[types.Part.from_function_response(
                    name="write_file", response={"result": "ok"})])]
    final = client.models.generate_content(model="gemini-2.5-flash", contents=history, config=config)
    assert final.text == "All done."
    sent = server.seen[1].messages
    assert sent[1]["tool_calls"][0]["id"] == call.id
    assert sent[2] == {"role": "tool", "tool_call_id": call.id, "content": "ok"}


def test_sdk_thought_round_trip(loopback):
    client, server, _ = loopback
    config = types.GenerateContentConfig(
        thinking_config=types.ThinkingConfig(include_thoughts=True),
        tools=[types.Tool(function_declarations=[types.FunctionDeclaration(name="list_directory")])],
        automatic_function_calling=types.AutomaticFunctionCallingConfig(disable=True))
    history = [types.Content(role="user", parts=[types.Part(text="polar:think list it")])]
    chunks = list(client.models.generate_content_stream(
        model="gemini-2.5-pro", contents=history, config=config))
    parts = [p for c in chunks for p in c.candidates[0].content.parts]
    assert any(p.thought and p.text == "thinking hard" for p in parts)
    signed = [p for p in parts if p.thought_signature]
    assert len(signed) == 1 and signed[0].function_call is not None
    # echo the model turn back without its thought parts, as Gemini CLI does
    model_turn = types.Content(role="model", parts=[p for p in parts if not p.thought])
    history += [model_turn, types.Content(role="user", parts=[types.Part.from_function_response(
        name="list_directory", response={"output": "polar.txt"})])]
    client.models.generate_content(model="gemini-2.5-pro", contents=history, config=config)
    assistant = server.seen[-1].messages[1]
    assert assistant["reasoning"] == "thinking hard"
    assert server.seen[-1].params["chat_template_kwargs"] == {"enable_thinking": True}


def test_sdk_count_tokens_and_errors(loopback):
    client, _, _ = loopback
    counted = client.models.count_tokens(model="gemini-2.5-flash", contents="some words to count")
    assert isinstance(counted.total_tokens, int) and counted.total_tokens > 0
    with pytest.raises(genai_errors.ClientError) as info:
        client.models.generate_content(model="gemini-2.5-flash", contents="x",
                                       config=types.GenerateContentConfig(candidate_count=3))
    assert info.value.code == 400 and info.value.status == "INVALID_ARGUMENT"
    assert "candidateCount" in info.value.message


# ---------------------------------------------------------------------------------------------
# integration through the real gateway (fixtures from tests/conftest.py)
# ---------------------------------------------------------------------------------------------


def _client(session: dict, version: str) -> genai.Client:
    return genai.Client(api_key=session["key"], http_options=types.HttpOptions(
        base_url=session["base_urls"]["gemini"], api_version=version))


WRITE_SCHEMA = {"type": "object", "properties": {"path": {"type": "string"},
                                                 "content": {"type": "string"}}, "required": ["path"]}
WRITE_TOOLS = [{"type": "function", "function": {"name": "write_file", "description": "Write a file",
                                                 "parameters": WRITE_SCHEMA}}]


def _write_tool_config(**kwargs: Any) -> types.GenerateContentConfig:
    write = types.FunctionDeclaration(name="write_file", description="Write a file",
                                      parameters_json_schema=WRITE_SCHEMA)
    return types.GenerateContentConfig(
        tools=[types.Tool(function_declarations=[write])],
        automatic_function_calling=types.AutomaticFunctionCallingConfig(disable=True), **kwargs)


def _check_record(record: dict, gateway: Any, *, model: str, stream: bool,
                  tools: list[dict] | None = None) -> None:
    """One capture record: provider, model, ids and logprobs as the upstream gives them.

    `tools` are the normalised tools in the order the client sent them: the /calls JSON sorts
    object keys, and a schema's key order changes the rendered prompt, so the replay uses these
    (after checking they are the recorded ones)."""
    assert record["provider"] == "gemini"
    assert record["model_requested"] == model
    assert record["stream"] is stream
    assert record["status"] == "ok"
    assert record["prompt_token_ids"] and record["completion_token_ids"]
    assert len(record["completion_logprobs"]) == len(record["completion_token_ids"])
    assert record["tools"] == (tools or [])
    body = {"model": record["model_served"], "messages": record["messages"],
            **gemini.to_chat(record["request"]).params}
    if tools:
        body["tools"] = tools
    data = gateway.upstream_chat(body)
    assert data["prompt_token_ids"] == record["prompt_token_ids"]
    assert data["choices"][0]["token_ids"] == record["completion_token_ids"]


@pytest.mark.parametrize("version", ["v1beta", "v1"])
def test_gateway_generate_stream_and_records(gateway, version):
    session = gateway.new_session()
    client = _client(session, version)
    resp = client.models.generate_content(model="gemini-polar", contents="polar:say=Hello from polar")
    assert resp.text == "Hello from polar"
    assert resp.model_version == "gemini-polar"
    chunks = list(client.models.generate_content_stream(
        model="gemini-polar", contents="polar:say=Streaming   text, unaltered!"))
    assert "".join(c.text or "" for c in chunks) == "Streaming   text, unaltered!"
    assert chunks[-1].candidates[0].finish_reason == types.FinishReason.STOP
    assert chunks[-1].usage_metadata.total_token_count > 0
    calls = gateway.calls(session["session_id"])
    assert len(calls) == 2
    _check_record(calls[0], gateway, model="gemini-polar", stream=False)
    _check_record(calls[1], gateway, model="gemini-polar", stream=True)


@pytest.mark.parametrize("version", ["v1beta", "v1"])
def test_gateway_function_calling_round_trip(gateway, version):
    session = gateway.new_session()
    client = _client(session, version)
    config = _write_tool_config()
    history = [types.Content(role="user", parts=[types.Part(text="Create the file please")])]
    first = client.models.generate_content(model="gemini-polar", contents=history, config=config)
    call = first.function_calls[0]
    assert call.name == "write_file" and call.args.get("path") == "polar.txt" and call.id
    history += [first.candidates[0].content,
                types.Content(role="user", parts=[types.Part(function_response=types.FunctionResponse(
                    id=call.id, name=call.name, response={"output": "written"}))])]
    final = client.models.generate_content(model="gemini-polar", contents=history, config=config)
    assert final.text and not final.function_calls
    calls = gateway.calls(session["session_id"])
    assert len(calls) == 2
    assert calls[0]["finish_reason"] == "tool_calls"
    tool_msgs = [m for m in calls[1]["messages"] if m["role"] == "tool"]
    assert tool_msgs == [{"role": "tool", "tool_call_id": call.id, "content": "written"}]
    for record in calls:
        _check_record(record, gateway, model="gemini-polar", stream=False, tools=WRITE_TOOLS)


def test_gateway_thought_round_trip(gateway):
    session = gateway.new_session()
    client = _client(session, "v1beta")
    config = _write_tool_config(thinking_config=types.ThinkingConfig(include_thoughts=True))
    history = [types.Content(role="user", parts=[types.Part(text="polar:think write it")])]
    chunks = list(client.models.generate_content_stream(
        model="gemini-polar", contents=history, config=config))
    parts = [p for c in chunks for p in c.candidates[0].content.parts]
    thought = "".join(p.text for p in parts if p.thought)
    assert thought
    assert [bool(p.thought_signature) for p in parts if p.function_call][0]
    history += [types.Content(role="model", parts=[p for p in parts if not p.thought]),
                types.Content(role="user", parts=[types.Part.from_function_response(
                    name="write_file", response={"output": "ok"})])]
    client.models.generate_content(model="gemini-polar", contents=history, config=config)
    calls = gateway.calls(session["session_id"])
    assert calls[0]["response_message"].get("reasoning") == thought
    assistant = [m for m in calls[1]["messages"] if m["role"] == "assistant"][0]
    assert assistant["reasoning"] == thought
    # the second prompt extends the first call's prompt + answer token by token
    assert calls[1]["prompt_token_ids"][:len(calls[0]["prompt_token_ids"])] == calls[0]["prompt_token_ids"]


@pytest.mark.parametrize("version", ["v1beta", "v1"])
def test_gateway_count_tokens_records_nothing(gateway, version):
    session = gateway.new_session()
    client = _client(session, version)  # keep a reference: a collected Client closes its HTTP client
    counted = client.models.count_tokens(model="gemini-polar", contents="count these tokens")
    assert counted.total_tokens > 0
    assert gateway.calls(session["session_id"]) == []


def test_gateway_gemini_cli_shaped_sse_request(gateway):
    session = gateway.new_session()
    url = f"{session['base_urls']['gemini']}/v1beta/models/gemini-polar:streamGenerateContent?alt=sse"
    body = copy.deepcopy(GEMINI_CLI_BODY)
    body["contents"] = body["contents"][:1]
    resp = requests.post(url, json=body, headers={"x-goog-api-key": session["key"]}, stream=True,
                         timeout=60)
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("text/event-stream")
    frames = _sse_frames(b"".join(resp.iter_content(None)), comments=True)
    calls = [p["functionCall"] for f in frames for p in f["candidates"][0]["content"]["parts"]
             if "functionCall" in p]
    assert calls and calls[0]["name"] == "write_file" and calls[0]["args"]["file_path"] == "polar.txt"
    assert frames[-1]["candidates"][0]["finishReason"] == "STOP"
    records = gateway.calls(session["session_id"])
    assert len(records) == 1 and records[0]["provider"] == "gemini" and records[0]["stream"] is True
    assert records[0]["tools"][0]["function"]["parameters"]["required"] == ["file_path", "content"]


def test_gateway_unknown_key_is_401_in_gemini_shape(gateway):
    session = gateway.new_session()
    bad = dict(session, key="not-a-key")
    bad["base_urls"] = {"gemini": gateway.url}
    client = _client(bad, "v1beta")
    with pytest.raises(genai_errors.ClientError) as info:
        client.models.generate_content(model="gemini-polar", contents="hi")
    assert info.value.code == 401 and info.value.status == "UNAUTHENTICATED"
    resp = requests.post(f"{gateway.url}/s/not-a-key/v1beta/models/m:generateContent",
                         json={"contents": [{"parts": [{"text": "hi"}]}]}, timeout=30)
    assert resp.status_code == 401
    assert resp.json()["error"]["status"] == "UNAUTHENTICATED"
    assert gateway.calls(session["session_id"]) == []


def test_gateway_stream_without_alt_sse_is_a_json_array(gateway):
    session = gateway.new_session()
    url = f"{session['base_urls']['gemini']}/v1beta/models/gemini-polar:streamGenerateContent"
    body = {"contents": [{"role": "user", "parts": [{"text": "polar:say=An array, not SSE."}]}]}
    resp = requests.post(url, json=body, headers={"x-goog-api-key": session["key"]}, timeout=60)
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("application/json")
    frames = resp.json()
    assert isinstance(frames, list)
    text = "".join(p.get("text", "") for f in frames for p in f["candidates"][0]["content"]["parts"])
    assert text == "An array, not SSE."
    assert frames[-1]["candidates"][0]["finishReason"] == "STOP"


def test_gateway_bad_request_and_context_overflow_in_gemini_shape(gateway):
    session = gateway.new_session()
    client = _client(session, "v1beta")
    with pytest.raises(genai_errors.ClientError) as info:
        client.models.generate_content(model="gemini-polar", contents="x",
                                       config=types.GenerateContentConfig(candidate_count=2))
    assert (info.value.code, info.value.status) == (400, "INVALID_ARGUMENT")
    assert "generationConfig.candidateCount" in info.value.message
    limit = requests.get(f"{gateway.upstream_url}/v1/models", timeout=10).json()["data"][0]["max_model_len"]
    huge = "lorem ipsum dolor sit amet " * (limit // 2)  # well past the upstream's context
    attempts = {"generate": lambda: client.models.generate_content(model="gemini-polar", contents=huge),
                "stream": lambda: list(client.models.generate_content_stream(model="gemini-polar",
                                                                             contents=huge))}
    for name, attempt in attempts.items():
        with pytest.raises(genai_errors.ClientError) as info:
            attempt()
        assert (info.value.code, info.value.status) == (400, "INVALID_ARGUMENT"), name
        match = re.fullmatch(r"The input token count \((\d+)\) exceeds the maximum number of tokens "
                             r"allowed \((\d+)\)\.", info.value.message)
        assert match, info.value.message
        assert int(match.group(1)) > int(match.group(2)) == limit


def test_gateway_slow_stream_survives_keepalives(gateway):
    """An upstream slower than the gateway's first-byte wait: keep-alive bytes go out before the
    frames, and google-genai must still read the stream."""
    session = gateway.new_session()
    client = _client(session, "v1beta")
    chunks = list(client.models.generate_content_stream(
        model="gemini-polar", contents="polar:sleep=3 polar:say=Worth the wait."))
    assert "".join(c.text or "" for c in chunks) == "Worth the wait."
