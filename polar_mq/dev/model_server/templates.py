"""Chat-template variants of the stand-in tokenizer, for testing what templates do to prompts.

``qwen3``: like Qwen3 in non-thinking mode. The generation prompt opens every answer with an empty
``<think>\\n\\n</think>\\n\\n`` (unless ``enable_thinking`` is true), but an assistant turn in
history renders without it and without its reasoning — so the messages path can never give call
n+1 a prompt that starts with call n's prompt + sampled ids (what token-in continuation fixes).
Served with ``--chat-template qwen3`` (the stand-in) or from the tokenizer directory
:func:`write_tokenizer_dir` writes (the gateway's ``--tokenizer``; the tiny vLLM model).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from polar_mq.dev.model_server.tokenizer import CHAT_TEMPLATE

_HISTORY_REASONING = """{%- set reasoning = none -%}
{%- if message.reasoning is defined and message.reasoning -%}
{%- set reasoning = message.reasoning -%}
{%- elif message.reasoning_content is defined and message.reasoning_content -%}
{%- set reasoning = message.reasoning_content -%}
{%- endif -%}
{%- if reasoning -%}
{{- '<think>\\n' + reasoning + '\\n</think>\\n\\n' -}}
{%- endif -%}
"""
_GEN_PROMPT = """{%- if add_generation_prompt -%}
{{- '<|im_start|>assistant\\n' -}}
{%- endif -%}
"""
QWEN3_STYLE = CHAT_TEMPLATE.replace(_HISTORY_REASONING, "").replace(_GEN_PROMPT, """{%- if add_generation_prompt -%}
{{- '<|im_start|>assistant\\n' -}}
{%- if enable_thinking is not defined or not enable_thinking -%}
{{- '<think>\\n\\n</think>\\n\\n' -}}
{%- endif -%}
{%- endif -%}
""")
assert QWEN3_STYLE.count("<think>") == 1 and "reasoning_content" not in QWEN3_STYLE

TEMPLATES = {"default": CHAT_TEMPLATE, "qwen3": QWEN3_STYLE}
FILES = ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja"]


def template(name_or_path: str) -> str:
    """A named variant, or the text of a Jinja file (as vLLM's ``--chat-template``)."""
    if name_or_path in TEMPLATES:
        return TEMPLATES[name_or_path]
    return Path(name_or_path).read_text(encoding="utf-8")


def write_tokenizer_dir(source: str | Path, dest: str | Path, chat_template: str) -> Path:
    """A copy of the tokenizer directory `source` whose chat template is `chat_template`."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    for name in FILES:
        if (Path(source) / name).exists():
            shutil.copy2(Path(source) / name, dest / name)
    cfg = json.loads((dest / "tokenizer_config.json").read_text(encoding="utf-8"))
    cfg["chat_template"] = chat_template
    (dest / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2, ensure_ascii=False), encoding="utf-8")
    (dest / "chat_template.jinja").write_text(chat_template, encoding="utf-8")
    return dest
