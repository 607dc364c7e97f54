"""An agent whose session has a fork and a chain break, for the trajectory viewer tests.

Run by the `shell` harness (OPENAI_BASE_URL / OPENAI_API_KEY = the session's). Call 1 asks for a
tool call; call 2 answers after its result; call 3 answers after a *different* result of the same
tool call (a fork); call 4 continues call 2's conversation under a changed system prompt (what a
harness with a per-turn header line does): the messages still continue, the tokens part inside
the earlier prompt, a chain break (template change).
"""

from __future__ import annotations

import os

from openai import OpenAI

TOOLS = [{"type": "function", "function": {
    "name": "write_file", "description": "Write text to a file.",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
                   "required": ["path", "content"]}}}]


def main() -> int:
    client = OpenAI()
    model = os.environ.get("POLAR_MODEL", "policy")
    history = [{"role": "system", "content": "You are a careful agent. Use tools to act."},
               {"role": "user", "content": os.environ["POLAR_INSTRUCTION"]}]
    first = client.chat.completions.create(model=model, messages=history, tools=TOOLS).choices[0].message
    call = first.tool_calls[0]
    assistant = first.model_dump(exclude_none=True)
    done = history + [assistant, {"role": "tool", "tool_call_id": call.id, "content": "wrote 16 bytes"}]
    second = client.chat.completions.create(model=model, messages=done, tools=TOOLS).choices[0].message
    failed = history + [assistant, {"role": "tool", "tool_call_id": call.id, "content": "error: disk full"}]
    client.chat.completions.create(model=model, messages=failed, tools=TOOLS)
    header = {"role": "system", "content": history[0]["content"] + " Turn 2 of the session."}
    later = [header, *done[1:], second.model_dump(exclude_none=True),
             {"role": "user", "content": "Thanks. polar:notool"}]
    client.chat.completions.create(model=model, messages=later, tools=TOOLS)
    print("four calls made")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
