"""A tiny tool-using agent: the official openai SDK in a loop, with one tool that writes files.

Run by the `shell` harness with the session env (OPENAI_BASE_URL, OPENAI_API_KEY = session key,
POLAR_INSTRUCTION, POLAR_MODEL). Every model call goes through the polar_mq gateway.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from openai import OpenAI

TOOLS = [{"type": "function", "function": {
    "name": "write_file", "description": "Write text to a file in the working directory.",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
                   "required": ["path", "content"]}}}]


def write_file(path: str, content: str) -> str:
    target = Path.cwd() / path
    if Path.cwd().resolve() not in target.resolve().parents:
        return f"error: {path} is outside the working directory"
    target.write_text(content)
    return f"wrote {len(content)} bytes to {path}"


def main() -> int:
    client = OpenAI()  # OPENAI_BASE_URL / OPENAI_API_KEY from the session env
    model = os.environ.get("POLAR_MODEL", "policy")
    messages = [{"role": "system", "content": "You are a careful agent. Use tools to act."},
                {"role": "user", "content": os.environ["POLAR_INSTRUCTION"]}]
    for turn in range(int(os.environ.get("TINY_AGENT_MAX_TURNS", "8"))):
        reply = client.chat.completions.create(model=model, messages=messages, tools=TOOLS).choices[0].message
        messages.append(reply.model_dump(exclude_none=True))
        if not reply.tool_calls:
            print(reply.content)
            return 0
        for call in reply.tool_calls:
            args = json.loads(call.function.arguments or "{}")
            result = write_file(**args) if call.function.name == "write_file" else f"unknown tool {call.function.name}"
            print(f"[turn {turn}] {call.function.name}({args}) -> {result}", flush=True)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    print("gave up: too many turns", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
