"""A multi-turn tool session per provider API, driven by the official SDKs (plain or streaming).

Four calls: ask → tool call, tool result → text, a new ask → tool call, tool result → text (the
stand-in's and the tiny overfit model's scripted behaviour). Returns what the client saw per call,
ids left out: ("tool", name, arguments) or ("text", text).
"""

from __future__ import annotations

import json
from typing import Any

WRITE_SCHEMA = {"type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
                "required": ["path", "content"]}
ASKS = ["Write hello from polar to polar.txt.", "Use the write tool to write polar.txt"]
RESULTS = ["Wrote 16 bytes to polar.txt", "Wrote 16 bytes to polar.txt"]
PROVIDERS = ["openai_chat", "openai_responses", "anthropic", "gemini"]
MODEL = "tiny"


def _openai(s: dict[str, Any]):
    import openai
    return openai.OpenAI(base_url=s["base_urls"]["openai"], api_key=s["key"], max_retries=0)


def chat_session(s: dict[str, Any], stream: bool, turns: int = 2) -> list[tuple]:
    c = _openai(s)
    tools = [{"type": "function", "function": {"name": "write", "description": "Write content to a file.",
                                               "parameters": WRITE_SCHEMA}}]
    msgs: list[dict[str, Any]] = []
    seen: list[tuple] = []
    for turn in range(turns):
        msgs.append({"role": "user", "content": ASKS[turn]})
        for _ in range(2):
            if stream:
                with c.chat.completions.stream(model=MODEL, messages=msgs, tools=tools) as st:
                    msg = st.get_final_completion().choices[0].message
            else:
                msg = c.chat.completions.create(model=MODEL, messages=msgs, tools=tools).choices[0].message
            if msg.tool_calls:
                tc = msg.tool_calls[0]
                seen.append(("tool", tc.function.name, json.loads(tc.function.arguments)))
                msgs.append({"role": "assistant", "content": msg.content,
                             "tool_calls": [t.model_dump(exclude_none=True) for t in msg.tool_calls]})
                msgs.append({"role": "tool", "tool_call_id": tc.id, "content": RESULTS[turn]})
            else:
                seen.append(("text", msg.content))
                msgs.append({"role": "assistant", "content": msg.content})
                break
    return seen


def responses_session(s: dict[str, Any], stream: bool, turns: int = 2) -> list[tuple]:
    c = _openai(s)
    tools = [{"type": "function", "name": "write", "description": "Write content to a file.",
              "parameters": WRITE_SCHEMA}]
    items: list[Any] = []
    seen: list[tuple] = []
    for turn in range(turns):
        items.append({"role": "user", "content": ASKS[turn]})
        for _ in range(2):
            if stream:
                with c.responses.stream(model=MODEL, input=items, tools=tools) as st:
                    resp = st.get_final_response()
            else:
                resp = c.responses.create(model=MODEL, input=items, tools=tools)
            items += [o.model_dump(exclude_none=True) for o in resp.output]
            call = next((o for o in resp.output if o.type == "function_call"), None)
            if call is not None:
                seen.append(("tool", call.name, json.loads(call.arguments)))
                items.append({"type": "function_call_output", "call_id": call.call_id, "output": RESULTS[turn]})
            else:
                seen.append(("text", resp.output_text))
                break
    return seen


def anthropic_session(s: dict[str, Any], stream: bool, turns: int = 2) -> list[tuple]:
    import anthropic
    c = anthropic.Anthropic(base_url=s["base_urls"]["anthropic"], api_key=s["key"], max_retries=0)
    tools = [{"name": "write", "description": "Write content to a file.", "input_schema": WRITE_SCHEMA}]
    msgs: list[dict[str, Any]] = []
    seen: list[tuple] = []
    for turn in range(turns):
        msgs.append({"role": "user", "content": ASKS[turn]})
        for _ in range(2):
            if stream:
                with c.messages.stream(model=MODEL, max_tokens=512, messages=msgs, tools=tools) as st:
                    msg = st.get_final_message()
            else:
                msg = c.messages.create(model=MODEL, max_tokens=512, messages=msgs, tools=tools)
            msgs.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in msg.content]})
            use = next((b for b in msg.content if b.type == "tool_use"), None)
            if use is not None:
                seen.append(("tool", use.name, dict(use.input)))
                msgs.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                                          "content": RESULTS[turn]}]})
            else:
                seen.append(("text", "".join(b.text for b in msg.content if b.type == "text")))
                break
    return seen


def gemini_session(s: dict[str, Any], stream: bool, turns: int = 2) -> list[tuple]:
    from google import genai
    from google.genai import types
    c = genai.Client(api_key=s["key"], http_options=types.HttpOptions(base_url=s["base_urls"]["gemini"]))
    decl = types.FunctionDeclaration(name="write", description="Write content to a file.",
                                     parameters_json_schema=WRITE_SCHEMA)
    config = types.GenerateContentConfig(
        tools=[types.Tool(function_declarations=[decl])],
        automatic_function_calling=types.AutomaticFunctionCallingConfig(disable=True))
    contents: list[Any] = []
    seen: list[tuple] = []
    for turn in range(turns):
        contents.append(types.Content(role="user", parts=[types.Part(text=ASKS[turn])]))
        for _ in range(2):
            if stream:
                parts: list[Any] = []
                for chunk in c.models.generate_content_stream(model=MODEL, contents=contents, config=config):
                    if chunk.candidates and chunk.candidates[0].content and chunk.candidates[0].content.parts:
                        parts += chunk.candidates[0].content.parts
                content = types.Content(role="model", parts=parts)
            else:
                content = c.models.generate_content(model=MODEL, contents=contents, config=config).candidates[0].content
            contents.append(content)
            call = next((p.function_call for p in content.parts or [] if p.function_call), None)
            if call is not None:
                seen.append(("tool", call.name, dict(call.args)))
                contents.append(types.Content(role="user", parts=[types.Part(function_response=types.FunctionResponse(
                    id=call.id, name=call.name, response={"result": RESULTS[turn]}))]))
            else:
                seen.append(("text", "".join(p.text or "" for p in content.parts or [] if not p.thought)))
                break
    return seen


SESSIONS = {"openai_chat": chat_session, "openai_responses": responses_session,
            "anthropic": anthropic_session, "gemini": gemini_session}


def qwen3_tokenizer_dir(dest) -> str:
    """The stand-in tokenizer with the Qwen3-style template (what the gateway's --tokenizer needs
    when the upstream serves that template)."""
    from polar_mq.dev.model_server.templates import QWEN3_STYLE
    from polar_mq.dev.model_server.templates import write_tokenizer_dir
    from polar_mq.dev.model_server.tokenizer import load_tokenizer

    return str(write_tokenizer_dir(load_tokenizer().path, dest, QWEN3_STYLE))


def start_qwen3_stack(log_dir, redis_url, tokenizer_dir: str):
    """The stand-in serving the Qwen3-style template, a gateway with tito on and one with it off:
    (model server, on, off)."""
    from tests.support.servers import GatewayHandle, start_gateway, start_model_server

    ms = start_model_server(log_dir, "--chat-template", "qwen3", "--max-model-len", "65536",
                            name="ms-qwen3")
    handles = []
    for mode in ("on", "off"):
        extra = ["--tito", mode] + (["--tokenizer", tokenizer_dir] if mode == "on" else [])
        server = start_gateway(log_dir, redis_url, [ms.url], *extra, name=f"gw-qwen3-{mode}")
        handles.append(GatewayHandle(url=server.url, upstream_url=ms.url, redis_url=redis_url, server=server))
    return ms, handles[0], handles[1]
