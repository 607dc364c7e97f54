"""The toy task family of the GRPO example: move a cursor in the direction the instruction names.

One fact per name, shared by the agent (what it sends), the base-model builder (what it trains
on), the grader (what it checks) and the demo (which rows it submits):

* the agent is an openai-SDK agent: the model answers in plain text with one direction word
  (one of ``DIRECTIONS``, each a single token of the project's tokenizer) and the end of turn, so
  the whole reply is two sampled ids and the only thing to learn is the decision; the agent
  carries the answer out (``move``: it writes ``cursor.json``, the world the grader checks);
* the instruction names the direction in one of ``PHRASES`` (so the model must read it);
* the reward is the test_runner's verdict on the cursor file the agent wrote (see grader.py).

An earlier version answered with a ``move(direction)`` tool call (~40 reply tokens): with a
2-layer model, GRPO's updates broke the tool-call format before the decision improved
(docs/rl.md, "What did not work"). The base model knows the answer format (p(end of turn) ~ 1)
but picks the direction nearly at random (p(correct) ~ 0.3 at temperature 1): a real chance of
success and room to improve.
"""

from __future__ import annotations

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
# no list of the four words: the only direction word in the prompt is the instruction's own
SYSTEM = "You control a cursor on a grid. Answer with the direction word only."
CURSOR_FILE = "cursor.json"
START = (2, 2)
STEP = {"up": (0, -1), "down": (0, 1), "left": (-1, 0), "right": (1, 0)}


def instruction(direction: str, phrase: int) -> str:
    return PHRASES[phrase % len(PHRASES)].format(d=direction)


def target_after(direction: str) -> tuple[int, int]:
    dx, dy = STEP[direction]
    return START[0] + dx, START[1] + dy


def rows(n: int, seed: int, offset: int = 0, turns: int = 1) -> list[dict[str, Any]]:
    """``n`` dataset rows (``instruction`` + ``metadata.target``), shuffled by ``seed``, in rounds
    of one row per direction (so a step of 4 prompts starting at a multiple of 4 asks for every
    direction once: the batch's advantages then reward reading the instruction, not a favourite
    direction). ``offset`` picks a disjoint slice of the same stream (the demo's step k takes rows
    ``k*n .. k*n+n-1``), so every step sees new prompts in a reproducible order.

    ``turns`` > 1: a multi-turn task, ``turns`` consecutive instructions of the same stream per row,
    one per line of ``instruction`` (the agent sends each as its own user turn: one model call per
    line, each call's prompt extends the one before, the case prefix_merging merges);
    ``metadata.target`` is the directions comma-joined, in order. ``turns`` = 1 is the single-turn
    task, row for row."""
    if turns < 1:
        raise ValueError("turns must be >= 1")
    rng = random.Random(seed)
    stream: list[dict[str, Any]] = []
    while len(stream) < (offset + n) * turns:
        phrases = {d: rng.sample(range(len(PHRASES)), len(PHRASES)) for d in DIRECTIONS}
        for r in range(len(PHRASES)):
            for d in rng.sample(DIRECTIONS, len(DIRECTIONS)):
                stream.append({"instruction": instruction(d, phrases[d][r]), "metadata": {"target": d}})
    out = []
    for i in range(offset, offset + n):
        part = stream[i * turns:(i + 1) * turns]
        out.append({"instruction": "\n".join(r["instruction"] for r in part),
                    "metadata": {"target": ",".join(r["metadata"]["target"] for r in part)}})
    return out


def targets(target: str) -> list[str]:
    """The directions of a row's ``metadata.target`` (one, or comma-joined for a multi-turn row)."""
    out = [t.strip() for t in target.split(",") if t.strip()]
    bad = [t for t in out if t not in STEP]
    if not out or bad:
        raise ValueError(f"bad target {target!r}: directions are {', '.join(DIRECTIONS)}")
    return out


def target_path(target: str) -> tuple[int, int]:
    """Where the cursor ends when every direction of ``target`` is taken in turn."""
    x, y = START
    for d in targets(target):
        dx, dy = STEP[d]
        x, y = x + dx, y + dy
    return x, y


def first_turn(direction: str, phrase: int) -> list[dict[str, Any]]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": instruction(direction, phrase)}]
