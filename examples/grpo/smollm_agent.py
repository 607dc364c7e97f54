"""The agent of the SmolLM2 GRPO run (examples/grpo/smollm.py): agent.py's loop with the prompt and
reply rule a real pretrained chat model needs.

SmolLM2-135M-Instruct chats: asked with task.SYSTEM it answers the direction word 0 times in 64
(docs/rl.md, "A real pretrained policy"). Here the system prompt lists the four words and the
reply may be a short sentence: the cursor moves the way the reply names when it names exactly one
direction ("up.", "Move up"); a reply naming none, or several ("up, down, left or right", the
base model's habit of echoing the list), moves nothing (reward 0). So the policy must learn to
read the instruction and to commit to one word.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from agent import converse, move  # noqa: E402
from task import STEP  # noqa: E402

SYSTEM = "You control a cursor on a grid. Answer with one word: up, down, left or right."
MAX_TOKENS = 8  # a word or a short sentence; the base model's longer chatter is cut here


def chosen(reply: str) -> str | None:
    """The one direction a reply names, or None (none, or several different ones)."""
    named = {w for w in re.findall(r"[a-z]+", reply.lower()) if w in STEP}
    return named.pop() if len(named) == 1 else None


def act(reply: str) -> str:
    d = chosen(reply)
    return move(d) if d else "no single direction: nothing moved"


def main() -> int:
    return converse(SYSTEM, MAX_TOKENS, act)


if __name__ == "__main__":
    sys.exit(main())
