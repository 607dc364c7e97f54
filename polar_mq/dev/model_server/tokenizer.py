"""A small, real, locally built tokenizer with a Qwen-style chat template.

The stand-in model server (and anything that needs to reproduce its token ids) uses
:func:`load_tokenizer`. The tokenizer is a byte-level BPE (vocab 4096) trained with the
``tokenizers`` library; the trained ``tokenizer.json`` ships in ``assets/`` so every machine gets
the same ids, and it is rebuilt from CPython's standard library only if the asset is missing.

The files are materialised into a cache directory (HF-loadable: ``tokenizer.json`` +
``tokenizer_config.json`` with ``chat_template``), so that e.g. a real vLLM can serve a model with
exactly the same tokenizer and template.

Design for the *prefix property* (the ids sampled for an assistant turn re-appear verbatim in the
next prompt): special tokens are split out before pre-tokenisation, and the pre-tokeniser isolates
every ``\\n`` before the byte-level regex, so no pre-token ever spans the ``assistant\\n`` header
and the body. The template renders an assistant message as exactly the completion text the server
samples (``<think>\\nR\\n</think>\\n\\n`` + content + ``\\n``-separated ``<tool_call>`` blocks).

Tests: tests/dev/test_model_server.py.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import shutil
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

from polar_mq._io.chat_template import compile_template as _compile_template
from polar_mq._io.chat_template import prepare_message as _prepare_message

SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
]
VOCAB_SIZE = 4096
CACHE_SUBDIR = "tokenizer-v1"
_ASSET = Path(__file__).with_name("assets") / "tokenizer.json"

# Qwen-style chat template. Assistant bodies render exactly as the stand-in server samples them.
CHAT_TEMPLATE = r"""{%- macro render_content(content) -%}
{%- if content is none -%}
{%- elif content is string -%}
{{- content -}}
{%- else -%}
{%- for part in content -%}
{%- if part is string -%}
{{- part -}}
{%- elif part.type == 'text' or part.type == 'input_text' or part.type == 'output_text' -%}
{{- part.text -}}
{%- endif -%}
{%- endfor -%}
{%- endif -%}
{%- endmacro -%}
{%- set ns = namespace(start=0) -%}
{%- if tools -%}
{{- '<|im_start|>system\n' -}}
{%- if messages and messages[0].role == 'system' -%}
{{- render_content(messages[0].content) + '\n\n' -}}
{%- set ns.start = 1 -%}
{%- endif -%}
{{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" -}}
{%- for tool in tools -%}
{{- '\n' -}}{{- tool | tojson -}}
{%- endfor -%}
{{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" -}}
{%- endif -%}
{%- for message in messages -%}
{%- if loop.index0 >= ns.start -%}
{%- if message.role == 'assistant' -%}
{{- '<|im_start|>assistant\n' -}}
{%- set reasoning = none -%}
{%- if message.reasoning is defined and message.reasoning -%}
{%- set reasoning = message.reasoning -%}
{%- elif message.reasoning_content is defined and message.reasoning_content -%}
{%- set reasoning = message.reasoning_content -%}
{%- endif -%}
{%- if reasoning -%}
{{- '<think>\n' + reasoning + '\n</think>\n\n' -}}
{%- endif -%}
{%- set content = render_content(message.content) -%}
{{- content -}}
{%- if message.tool_calls is defined and message.tool_calls -%}
{%- for tool_call in message.tool_calls -%}
{%- if not loop.first or content -%}
{{- '\n' -}}
{%- endif -%}
{%- if tool_call.function is defined and tool_call.function -%}
{%- set fn = tool_call.function -%}
{%- else -%}
{%- set fn = tool_call -%}
{%- endif -%}
{{- '<tool_call>\n{"name": ' + (fn.name | tojson) + ', "arguments": ' -}}
{%- if fn.arguments is string -%}
{{- fn.arguments -}}
{%- else -%}
{{- fn.arguments | tojson -}}
{%- endif -%}
{{- '}\n</tool_call>' -}}
{%- endfor -%}
{%- endif -%}
{{- '<|im_end|>\n' -}}
{%- elif message.role == 'tool' -%}
{%- if loop.first or loop.previtem.role != 'tool' -%}
{{- '<|im_start|>user' -}}
{%- endif -%}
{{- '\n<tool_response>\n' + render_content(message.content) + '\n</tool_response>' -}}
{%- if loop.last or loop.nextitem.role != 'tool' -%}
{{- '<|im_end|>\n' -}}
{%- endif -%}
{%- else -%}
{{- '<|im_start|>' + message.role + '\n' + render_content(message.content) + '<|im_end|>\n' -}}
{%- endif -%}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
{{- '<|im_start|>assistant\n' -}}
{%- endif -%}
"""


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte <-> printable unicode map used by byte-level BPE."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(
        range(ord("®"), ord("ÿ") + 1)
    )
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))


_BYTE_DECODER = {v: k for k, v in _bytes_to_unicode().items()}


def _corpus_files() -> list[Path]:
    """A fixed, sorted list of stdlib sources (only used when the shipped asset is missing)."""
    import sysconfig

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    names = [
        "argparse.py", "ast.py", "calendar.py", "configparser.py", "csv.py", "dataclasses.py",
        "datetime.py", "difflib.py", "email/message.py", "enum.py", "fractions.py", "functools.py",
        "gettext.py", "inspect.py", "json/decoder.py", "json/encoder.py", "logging/__init__.py",
        "pathlib.py", "pprint.py", "shutil.py", "string.py", "subprocess.py", "tarfile.py",
        "textwrap.py", "threading.py", "typing.py", "unittest/case.py", "urllib/parse.py",
        "uuid.py", "zipfile.py", "this.py", "tempfile.py", "random.py", "statistics.py",
    ]
    return [stdlib / n for n in names if (stdlib / n).is_file()]


def _extra_corpus() -> list[str]:
    """Chat-ish text so common English words, JSON and the template text get merges."""
    lines = [
        CHAT_TEMPLATE,
        "Hello from the stand-in model. You said: hello, please write a file.",
        "Done: the tool returned hello from polar.",
        '{"name": "Write", "arguments": {"file_path": "polar.txt", "content": "hello from polar"}}',
        '{"name": "Bash", "arguments": {"command": "echo hello from polar > polar.txt"}}',
        "You are a helpful assistant. The user asked a question; I will answer briefly.",
    ]
    return lines * 50


def _build_tokenizer_json() -> str:
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex("\n"), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    texts = [p.read_text(encoding="utf-8", errors="replace") for p in _corpus_files()]
    texts += _extra_corpus()
    tok.train_from_iterator(texts, trainer=trainer)
    return tok.to_str()


def _tokenizer_config(eos_id: int, specials: dict[str, int]) -> dict[str, Any]:
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": 131072,
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "clean_up_tokenization_spaces": False,
        "split_special_tokens": False,
        "add_bos_token": False,
        "add_eos_token": False,
        "errors": "replace",
        "additional_special_tokens": [t for t in SPECIAL_TOKENS if t not in ("<|im_end|>", "<|endoftext|>")],
        "added_tokens_decoder": {
            str(i): {
                "content": t,
                "lstrip": False,
                "normalized": False,
                "rstrip": False,
                "single_word": False,
                "special": True,
            }
            for t, i in specials.items()
        },
        "chat_template": CHAT_TEMPLATE,
    }


def _files_for(tokenizer_json: str) -> dict[str, str]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_str(tokenizer_json)
    specials = {t: tok.token_to_id(t) for t in SPECIAL_TOKENS}
    cfg = _tokenizer_config(specials["<|im_end|>"], specials)
    special_map = {
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "additional_special_tokens": cfg["additional_special_tokens"],
    }
    return {
        "tokenizer.json": tokenizer_json,
        "tokenizer_config.json": json.dumps(cfg, indent=2, ensure_ascii=False),
        "special_tokens_map.json": json.dumps(special_map, indent=2),
        "chat_template.jinja": CHAT_TEMPLATE,
    }


def _source_tokenizer_json() -> str:
    if _ASSET.is_file():
        return _ASSET.read_text(encoding="utf-8")
    return _build_tokenizer_json()


def _stamp(files: dict[str, str]) -> str:
    h = hashlib.sha256()
    for name in sorted(files):
        h.update(name.encode())
        h.update(b"\0")
        h.update(files[name].encode("utf-8"))
        h.update(b"\0")
    return h.hexdigest()


def _default_root() -> Path:
    env = os.environ.get("POLAR_CACHE_DIR")
    if env:
        return Path(env)
    return Path.home() / ".cache" / "polar_mq"


def _materialise(target: Path) -> Path:
    """Make sure ``target`` holds the current tokenizer files; atomic, safe under races."""
    files = _files_for(_source_tokenizer_json())
    stamp = _stamp(files)
    stamp_file = target / "polar_stamp.txt"
    try:
        if stamp_file.read_text() == stamp:
            return target
    except OSError:
        pass
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tok-", dir=str(target.parent)))
    os.chmod(tmp, 0o755)
    try:
        for name, text in files.items():
            (tmp / name).write_text(text, encoding="utf-8")
        (tmp / "polar_stamp.txt").write_text(stamp)
        try:
            os.rename(tmp, target)  # atomic when target does not exist yet
            return target
        except OSError:
            pass
        # target exists (another process won the race, or a stale version): check or refresh it
        try:
            if stamp_file.read_text() == stamp:
                return target
        except OSError:
            pass
        target.mkdir(parents=True, exist_ok=True)
        for name in list(files) + ["polar_stamp.txt"]:  # stamp last
            os.replace(tmp / name, target / name)
        return target
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


class ChatTokenizer:
    """Encode/decode plus chat-template rendering, equal to what HF/vLLM would do with ``path``."""

    eos_token: str = "<|im_end|>"

    def __init__(self, path: str | os.PathLike[str]):
        from tokenizers import Tokenizer

        self.path = str(path)
        self._tok = Tokenizer.from_file(os.path.join(self.path, "tokenizer.json"))
        self.eos_token_id: int = self._tok.token_to_id(self.eos_token)
        self.special_ids: dict[str, int] = {t: self._tok.token_to_id(t) for t in SPECIAL_TOKENS}
        self._special_id_set = set(self.special_ids.values())
        self.vocab_size: int = self._tok.get_vocab_size(with_added_tokens=True)
        with open(os.path.join(self.path, "tokenizer_config.json"), encoding="utf-8") as f:
            self.chat_template: str = json.load(f)["chat_template"]
        self._template = _compile_template(self.chat_template)
        self._lock = threading.Lock()

    def with_template(self, chat_template: str) -> "ChatTokenizer":
        """The same tokenizer rendering with another chat template."""
        other = copy.copy(self)
        other.chat_template = chat_template
        other._template = _compile_template(chat_template)
        return other

    # ---- ids <-> text ---------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def is_special(self, token_id: int) -> bool:
        return token_id in self._special_id_set

    def raw_bytes(self, token_id: int) -> bytes:
        """The exact bytes this token stands for (special tokens: their UTF-8 text)."""
        if token_id in self._special_id_set:
            return self._tok.id_to_token(token_id).encode("utf-8")
        piece = self._tok.id_to_token(token_id)
        if piece is None:
            return b""
        return bytes(_BYTE_DECODER[c] for c in piece)

    def token_str(self, token_id: int) -> str:
        """The token as vLLM shows it in logprobs (``convert_tokens_to_string([tok])``)."""
        return self.raw_bytes(token_id).decode("utf-8", errors="replace")

    def token_bytes(self, token_id: int) -> list[int]:
        """vLLM's ``bytes`` field: the UTF-8 bytes of :meth:`token_str`."""
        return list(self.token_str(token_id).encode("utf-8", errors="replace"))

    # ---- chat template --------------------------------------------------------------------
    def render(
        self,
        messages: list[dict],
        tools: list[dict] | None = None,
        add_generation_prompt: bool = True,
        **template_kwargs: Any,
    ) -> str:
        msgs = [_prepare_message(m) for m in messages]
        kwargs = dict(template_kwargs)
        kwargs.setdefault("bos_token", "")
        kwargs.setdefault("eos_token", self.eos_token)
        return self._template.render(
            messages=msgs, tools=tools or None, add_generation_prompt=add_generation_prompt, **kwargs
        )

    def apply_chat_template(
        self,
        messages: list[dict],
        tools: list[dict] | None = None,
        add_generation_prompt: bool = True,
        **kw: Any,
    ) -> list[int]:
        return self.encode(self.render(messages, tools=tools, add_generation_prompt=add_generation_prompt, **kw))


_LOADED: dict[str, ChatTokenizer] = {}
_LOAD_LOCK = threading.Lock()


def load_tokenizer(cache_dir: str | None = None) -> ChatTokenizer:
    """The stand-in tokenizer. Files live in ``<root>/tokenizer-v1`` where root is ``cache_dir``,
    else ``$POLAR_CACHE_DIR``, else ``~/.cache/polar_mq``. Cached per process."""
    root = Path(cache_dir) if cache_dir else _default_root()
    target = (root / CACHE_SUBDIR).resolve()
    key = str(target)
    with _LOAD_LOCK:
        tok = _LOADED.get(key)
        if tok is None:
            _materialise(target)
            tok = ChatTokenizer(target)
            _LOADED[key] = tok
        return tok


def build_asset(dest: str | None = None) -> str:
    """Retrain the BPE and write it to the package asset (maintainers only)."""
    out = Path(dest) if dest else _ASSET
    out.parent.mkdir(parents=True, exist_ok=True)
    text = _build_tokenizer_json()
    out.write_text(text, encoding="utf-8")
    return str(out)


if __name__ == "__main__":  # pragma: no cover
    print(build_asset(sys.argv[1] if len(sys.argv) > 1 else None))
