"""The GRPO example's agent: the official openai SDK, sampling at temperature 1.

Run by the ``shell`` harness with the session env (OPENAI_BASE_URL, OPENAI_API_KEY = session key,
POLAR_INSTRUCTION); the call goes through the polar_mq gateway, which records the sampled ids and
logprobs. The model answers in plain text (one direction word); the agent carries it out with
``move``, which changes the world the grader checks: ``cursor.json`` in the working directory.
An answer that is not a direction moves nothing (the checks fail: reward 0).

A multi-turn task (``task.rows(turns=K)``) has one instruction per line: each is a user turn of
the same conversation, answered by its own model call whose prompt is the previous call's prompt +
the reply + the next instruction (K calls per session: prefix_merging's one trace vs per_request's K).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Callable

from openai import OpenAI

sys.path.insert(0, str(Path(__file__).resolve().parent))
from task import CURSOR_FILE, START, STEP, SYSTEM  # noqa: E402

MAX_TOKENS = 4  # a direction word and the end of turn; anything longer is not an answer


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


def converse(system: str, max_tokens: int, act: Callable[[str], str]) -> int:
    """One conversation: every line of POLAR_INSTRUCTION a user turn, every reply carried out by
    ``act`` (its result printed), the reply kept in the history as sent."""
    client = OpenAI()
    model = os.environ.get("POLAR_MODEL", "policy")
    temperature = float(os.environ.get("GRPO_TEMPERATURE", "1.0"))
    messages: list = [{"role": "system", "content": system}]
    for line in os.environ["POLAR_INSTRUCTION"].splitlines():
        if not line.strip():
            continue
        messages.append({"role": "user", "content": line.strip()})
        reply = client.chat.completions.create(model=model, messages=messages, temperature=temperature,
                                               max_tokens=max_tokens).choices[0].message
        text = reply.content or ""
        print(f"answer {text!r} -> {act(text)}", flush=True)
        messages.append({"role": "assistant", "content": text})
    return 0


def main() -> int:
    return converse(SYSTEM, MAX_TOKENS, lambda text: move(text.strip()))


if __name__ == "__main__":
    sys.exit(main())
