"""The gateway's local copy of the served model's tokenizer and chat template.

Token-in continuation renders only the *new* messages of a conversation, so the gateway needs the
same template and tokenizer as the upstream: a Hugging Face tokenizer directory (``--tokenizer
PATH``: ``tokenizer.json`` + ``tokenizer_config.json``, the template there or in
``chat_template.jinja``), loaded with the ``tokenizers`` library and rendered with Jinja the way
transformers and vLLM render it (sandboxed, ``trim_blocks``/``lstrip_blocks``, tool-call arguments
given as JSON strings parsed to objects first).
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

from polar_mq._io.chat_template import compile_template, prepare_message


class TokenizerError(Exception):
    """The tokenizer directory is missing a file or a field the gateway needs."""


def _token_text(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None


class LocalTokenizer:
    def __init__(self, path: str):
        from tokenizers import Tokenizer

        root = Path(path)
        if (root / "tokenizer" / "tokenizer.json").exists() and not (root / "tokenizer.json").exists():
            root = root / "tokenizer"
        self.path = str(root)
        try:
            self._tok = Tokenizer.from_file(str(root / "tokenizer.json"))
            config = json.loads((root / "tokenizer_config.json").read_text(encoding="utf-8"))
        except Exception as exc:  # OSError, bad JSON, or the tokenizers library's own errors
            raise TokenizerError(f"cannot load the tokenizer in {path}: {exc}") from exc
        template = config.get("chat_template")
        if isinstance(template, list):  # [{"name": "default", "template": ...}, ...]
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            template = named.get("default") or next(iter(named.values()), None)
        jinja = root / "chat_template.jinja"
        if jinja.exists():
            template = jinja.read_text(encoding="utf-8")
        if not isinstance(template, str) or not template:
            raise TokenizerError(f"{path} has no chat template")
        self.chat_template = template
        self._template = compile_template(template)
        eos_token = _token_text(config.get("eos_token"))
        self.bos_token = _token_text(config.get("bos_token")) or ""
        if not eos_token:
            raise TokenizerError(f"{path}: tokenizer_config.json names no eos_token")
        self.eos_token: str = eos_token
        eos_id = self._tok.token_to_id(self.eos_token)
        if eos_id is None:
            raise TokenizerError(f"{path}: the eos token {self.eos_token!r} is not in the vocabulary")
        self.eos_token_id: int = eos_id
        self.special_ids = {int(i) for i, tok in self._tok.get_added_tokens_decoder().items()
                            if tok.special}

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
               add_generation_prompt: bool = True, **kwargs: Any) -> str:
        kw = {k: v for k, v in kwargs.items() if k not in ("messages", "tools", "add_generation_prompt")}
        kw.setdefault("bos_token", self.bos_token)
        kw.setdefault("eos_token", self.eos_token)
        text: str = self._template.render(messages=[prepare_message(m) for m in messages],
                                          tools=tools or None, add_generation_prompt=add_generation_prompt,
                                          **kw)
        return text


_CACHE: dict[str, LocalTokenizer] = {}
_CACHE_LOCK = threading.Lock()


def load(path: str) -> LocalTokenizer:
    with _CACHE_LOCK:
        tok = _CACHE.get(path)
        if tok is None:
            tok = _CACHE[path] = LocalTokenizer(path)
        return tok
