"""The GRPO example's agent: the official openai SDK in a tool loop, sampling at temperature 1.

Run by the ``shell`` harness with the session env (OPENAI_BASE_URL, OPENAI_API_KEY = session key,
POLAR_INSTRUCTION); every call goes through the polar_mq gateway, which records the sampled ids
and logprobs. The one tool, ``move``, changes the world the grader checks: ``cursor.json`` in the
working directory.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from openai import OpenAI

sys.path.insert(0, str(Path(__file__).resolve().parent))
from task import CURSOR_FILE, START, STEP, SYSTEM, TOOLS  # noqa: E402

MAX_TURNS = 3


def move(direction: str) -> str:
    """Move the cursor one cell; the file records every move (the grader reads it)."""
    path = Path.cwd() / CURSOR_FILE
    state = json.loads(path.read_text()) if path.exists() else {"x": START[0], "y": START[1], "moves": []}
    if direction not in STEP:
        return f"error: unknown direction {direction!r} (use one of {', '.join(STEP)})"
    dx, dy = STEP[direction]
    state["x"], state["y"] = state["x"] + dx, state["y"] + dy
    state["moves"].append(direction)
    path.write_text(json.dumps(state))
    return f"cursor at {state['x']},{state['y']}"


def main() -> int:
    client = OpenAI()
    model = os.environ.get("POLAR_MODEL", "policy")
    temperature = float(os.environ.get("GRPO_TEMPERATURE", "1.0"))
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": os.environ["POLAR_INSTRUCTION"]}]
    for _ in range(MAX_TURNS):
        reply = client.chat.completions.create(model=model, messages=messages, tools=TOOLS,
                                               temperature=temperature, max_tokens=48).choices[0].message
        messages.append(reply.model_dump(exclude_none=True))
        if not reply.tool_calls:
            print(reply.content)
            return 0
        for call in reply.tool_calls:
            try:
                args = json.loads(call.function.arguments or "{}")
            except ValueError:
                args = {}
            result = (move(str(args.get("direction"))) if call.function.name == "move"
                      else f"error: unknown tool {call.function.name}")
            print(f"{call.function.name}({args}) -> {result}", flush=True)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    print("gave up: too many turns", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
