"""A rendered chat prompt read back into messages and tools (for token-id prompts).

vLLM answers `/v1/completions` from whatever the ids say; the stand-in has no model, so to answer
a token-id prompt the way its chat endpoint answers the same conversation (the gateway's token-in
continuation sends exactly such prompts) it reads the conversation back out of the rendering of
its own template: ``<|im_start|>role\\n…<|im_end|>`` blocks, the ``<tools>`` block of the system
turn, ``<tool_call>`` blocks of assistant turns, ``<tool_response>`` blocks of tool results.
"""

from __future__ import annotations

import json
from typing import Any

from polar_mq.dev.model_server.completion import parse_completion

_START, _END = "<|im_start|>", "<|im_end|>"
_TOOLS_HEAD = "# Tools\n\n"


def _system(body: str) -> tuple[str | None, list[dict]]:
    at = body.find(_TOOLS_HEAD)
    if at < 0:
        return body, []
    system = body[:at].removesuffix("\n\n") or None
    tools = []
    start = body.find("<tools>\n", at)
    block = body[start + len("<tools>\n"): body.find("\n</tools>", start)] if start >= 0 else ""
    for line in block.split("\n"):
        line = line.strip()
        if line:
            try:
                tools.append(json.loads(line))
            except ValueError:
                pass
    return system, tools


def _tool_results(body: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for piece in body.split("<tool_response>\n")[1:]:
        content = piece.split("\n</tool_response>", 1)[0]
        out.append({"role": "tool", "tool_call_id": f"call_{len(out)}", "content": content})
    return out


def read_chat(prompt_text: str) -> tuple[list[dict[str, Any]], list[dict] | None] | None:
    """(messages, tools) of a prompt rendered by the stand-in template, ending in an open
    assistant turn; None when the text is not such a prompt."""
    if not prompt_text.startswith(_START):
        return None
    blocks = prompt_text.split(_START)[1:]
    messages: list[dict[str, Any]] = []
    tools: list[dict] = []
    for i, block in enumerate(blocks):
        role, _, rest = block.partition("\n")
        last = i == len(blocks) - 1
        body = rest.split(_END, 1)[0]
        if last:
            if role != "assistant" or _END in rest:
                return None
            break
        if role == "system" and i == 0:
            system, tools = _system(body)
            if system is not None:
                messages.append({"role": "system", "content": system})
        elif role == "user" and body.lstrip("\n").startswith("<tool_response>"):
            messages.extend(_tool_results(body))
        elif role == "assistant":
            p = parse_completion(body)
            msg: dict[str, Any] = {"role": "assistant", "content": p.content}
            if p.tool_calls:
                msg["tool_calls"] = [{"id": f"call_{k}", "type": "function", "function": c}
                                     for k, c in enumerate(p.tool_calls)]
            if p.reasoning:
                msg["reasoning"] = p.reasoning
            messages.append(msg)
        else:
            messages.append({"role": role, "content": body})
    return messages, tools or None
