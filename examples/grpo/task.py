"""The toy task family of the GRPO example: move a cursor in the direction the instruction names.

One fact per name, shared by the agent (what it sends), the base-model builder (what it trains
on), the grader (what it checks) and the demo (which rows it submits):

* the agent is an openai-SDK tool loop with one tool, ``move(direction)``, ``direction`` one of
  ``DIRECTIONS`` (each a single token of the project's tokenizer, so the choice is one sampled id);
* the instruction names the direction in one of ``PHRASES`` (so the model must read it);
* the reward is the test_runner's verdict on the cursor file the tool wrote (see grader.py).

The base model knows the tool-call format perfectly but picks the direction nearly at random
(p(correct) ~ 0.3 at temperature 1): a real chance of success and room to improve.
"""

from __future__ import annotations

import json
import random
from typing import Any

DIRECTIONS = ["up", "down", "left", "right"]
PHRASES = [
    "Move the cursor {d}.",
    "Press the {d} arrow key once.",
    "Go {d} one step.",
    "Step {d}, please.",
    "The cursor should move {d}.",
    "Shift the cursor one cell {d}.",
]
SYSTEM = "You control a cursor on a grid. Call the move tool once, then say Done."
DONE_TEXT = "Done."
CURSOR_FILE = "cursor.json"
START = (2, 2)
STEP = {"up": (0, -1), "down": (0, 1), "left": (-1, 0), "right": (1, 0)}

MOVE_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "move",
        "description": "Move the cursor one cell.",
        "parameters": {
            "type": "object",
            # no enum: the only direction word in the prompt is the instruction's own (an enum
            # listing all four would be a distractor the tiny model must learn to look past)
            "properties": {"direction": {"type": "string", "description": "Which way to move."}},
            "required": ["direction"],
        },
    },
}
TOOLS = [MOVE_TOOL]


def instruction(direction: str, phrase: int) -> str:
    return PHRASES[phrase % len(PHRASES)].format(d=direction)


def target_after(direction: str) -> tuple[int, int]:
    dx, dy = STEP[direction]
    return START[0] + dx, START[1] + dy


def rows(n: int, seed: int, offset: int = 0) -> list[dict[str, Any]]:
    """``n`` dataset rows (``instruction`` + ``metadata.target``), balanced over the directions,
    shuffled by ``seed``. ``offset`` picks a disjoint slice of the same stream (the demo's step k
    takes rows ``k*n .. k*n+n-1``), so every step sees new prompts in a reproducible order."""
    rng = random.Random(seed)
    stream: list[dict[str, Any]] = []
    while len(stream) < offset + n:
        block = [(d, p) for d in DIRECTIONS for p in range(len(PHRASES))]
        rng.shuffle(block)
        stream.extend({"instruction": instruction(d, p), "metadata": {"target": d}} for d, p in block)
    return stream[offset:offset + n]


def first_turn(direction: str, phrase: int) -> list[dict[str, Any]]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": instruction(direction, phrase)}]


def tool_call(direction: str, call_id: str = "call_0") -> dict[str, Any]:
    return {"id": call_id, "type": "function",
            "function": {"name": "move", "arguments": json.dumps({"direction": direction})}}


def tool_result(direction: str) -> str:
    x, y = target_after(direction)
    return f"cursor at {x},{y}"
