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

import os
import re
import sys
from pathlib import Path

from openai import OpenAI

sys.path.insert(0, str(Path(__file__).resolve().parent))
from agent import move  # noqa: E402
from task import STEP  # noqa: E402

SYSTEM = "You control a cursor on a grid. Answer with one word: up, down, left or right."
MAX_TOKENS = 8  # a word or a short sentence; the base model's longer chatter is cut here


def chosen(reply: str) -> str | None:
    """The one direction a reply names, or None (none, or several different ones)."""
    named = {w for w in re.findall(r"[a-z]+", reply.lower()) if w in STEP}
    return named.pop() if len(named) == 1 else None


def main() -> int:
    client = OpenAI()
    model = os.environ.get("POLAR_MODEL", "policy")
    temperature = float(os.environ.get("GRPO_TEMPERATURE", "1.0"))
    messages: list = [{"role": "system", "content": SYSTEM}]
    for line in os.environ["POLAR_INSTRUCTION"].splitlines():
        if not line.strip():
            continue
        messages.append({"role": "user", "content": line.strip()})
        reply = client.chat.completions.create(model=model, messages=messages, temperature=temperature,
                                               max_tokens=MAX_TOKENS).choices[0].message
        text = reply.content or ""
        d = chosen(text)
        print(f"answer {text!r} -> {move(d) if d else 'no single direction: nothing moved'}", flush=True)
        messages.append({"role": "assistant", "content": text})
    return 0


if __name__ == "__main__":
    sys.exit(main())
