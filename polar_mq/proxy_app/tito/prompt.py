"""The continued prompt: the parent's ids, its sampled ids, then the new messages' tokens.

The tail (everything the template puts after the parent's assistant turn: the rest of that turn's
glue, the new messages, the generation prompt) is rendered from the request's whole conversation
with the same template, so template logic that looks at the whole history (Qwen3's
``last_query_index``, ``loop.last``, the tool block) sees what it would see on the messages path.
The parent's reply is replaced by a sentinel message, and the tail is what follows the sentinel's
end-of-turn token. What the model sampled is never re-rendered: the ids that matter for training
stay exactly the ids that were sampled.

Tests: tests/tito/test_tito.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from polar_mq.model import CaptureRecord
from polar_mq.proxy_app.tito.tokenizer import LocalTokenizer

SENTINEL = "\u2063polar-tito-sentinel\u2063"


class TailError(Exception):
    """The template does not render the parent turn in a way the tail can be cut from."""


@dataclass
class ContinuedPrompt:
    ids: list[int]
    parent_ids: int  # how many ids come from the parent (prompt + sampled + end-of-turn)
    eos_added: bool  # the parent's sampled ids lacked the end-of-turn token; it was added


def render_tail(tok: LocalTokenizer, messages: list[dict[str, Any]], reply_index: int,
                tools: list[dict[str, Any]] | None, template_kwargs: dict[str, Any]) -> str:
    probe = list(messages)
    probe[reply_index] = {"role": "assistant", "content": SENTINEL}
    text = tok.render(probe, tools, add_generation_prompt=True, **template_kwargs)
    at = text.find(SENTINEL)
    if at < 0 or text.find(SENTINEL, at + 1) >= 0:
        raise TailError("the chat template did not render the parent reply exactly once")
    end = text.find(tok.eos_token, at + len(SENTINEL))
    if end < 0:
        raise TailError(f"the chat template ends the assistant turn without {tok.eos_token!r}")
    return text[end + len(tok.eos_token):]


def continued_prompt(tok: LocalTokenizer, parent: CaptureRecord, messages: list[dict[str, Any]],
                     tools: list[dict[str, Any]] | None,
                     template_kwargs: dict[str, Any]) -> ContinuedPrompt:
    reply_index = len(parent.messages)
    tail = render_tail(tok, messages, reply_index, tools, template_kwargs)
    head = list(parent.prompt_token_ids) + list(parent.completion_token_ids)
    eos_added = parent.completion_token_ids[-1] != tok.eos_token_id
    if eos_added:  # truncated or stopped by a stop string: the template closes the turn
        head.append(tok.eos_token_id)
    return ContinuedPrompt(head + tok.encode(tail), len(head), eos_added)
