#!/usr/bin/env python3
"""The tiny model again, served with a Qwen3-style chat template that does not round-trip.

    PYTHONPATH=. ~/.cache/polar_mq/vllm-venv/bin/python scripts/build_tiny_qwen3.py --out DIR

Writes ``DIR/qwen3``: the ``overfit`` model (``scripts/build_tiny_model.py``, built first) tuned
further on multi-turn tool sessions, with the stand-in's tokenizer and a template like Qwen3's in
non-thinking mode: the generation prompt is ``<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n``
but an assistant turn in history renders without it (and without its reasoning). So on the
messages path call n+1's prompt is never call n's prompt + sampled ids — the asymmetry token-in
continuation removes. The template is ``polar_mq.dev.model_server.templates.QWEN3_STYLE``. The model is tuned on both renderings of each history (the template's, and
the token-in one: sampled ids kept verbatim), so greedy decoding answers a four-call session
(ask → write tool call, result → FINAL_TEXT, ask → tool call, result → FINAL_TEXT) either way.

A separate script (not a variant inside build_tiny_model.py) so that the existing models' stamps,
which hash that script's source, do not change. Own stamp: this file + the rendered training ids.
"""

from __future__ import annotations

import argparse
import hashlib
import inspect
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

import build_tiny_model as base  # noqa: E402
from polar_mq.dev.model_server.templates import QWEN3_STYLE as QWEN3_TEMPLATE  # noqa: E402
from polar_mq.dev.model_server.templates import write_tokenizer_dir  # noqa: E402
from polar_mq.dev.model_server.tokenizer import load_tokenizer  # noqa: E402

WRITE_TOOL = {"type": "function", "function": {
    "name": "write", "description": "Write content to a file.",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
                   "required": ["path", "content"]}}}
ASKS = ["Write hello from polar to polar.txt.", "Use the write tool to write polar.txt"]
RESULT = "Wrote 16 bytes to polar.txt"
CALL_BODY = '<tool_call>\n' + json.dumps({"name": "write", "arguments": base.TOOL_ARGS}) + '\n</tool_call>'
MAX_STEPS = 300


class Qwen3Tokenizer:
    """The stand-in tokenizer with the Qwen3-style template (render + encode)."""

    def __init__(self, tok):
        from polar_mq.dev.model_server.tokenizer import _compile_template
        from polar_mq.dev.model_server.tokenizer import _prepare_message

        self.tok = tok
        self.eos_token_id = tok.eos_token_id
        self.special_ids = tok.special_ids
        self.vocab_size = tok.vocab_size
        self._t = _compile_template(QWEN3_TEMPLATE)
        self._prep = _prepare_message

    def render(self, messages, tools=None, add_generation_prompt=True):
        return self._t.render(messages=[self._prep(m) for m in messages], tools=tools or None,
                              add_generation_prompt=add_generation_prompt, bos_token="", eos_token="<|im_end|>")

    def encode(self, text):
        return self.tok.encode(text)


def examples(q: Qwen3Tokenizer) -> list[tuple[list[int], int]]:
    """Every call of a four-call session, its prompt rendered both ways (template / token-in)."""
    out = []
    tools = [WRITE_TOOL]
    call = {"id": "call_0", "type": "function", "function": {"name": "write", "arguments": json.dumps(base.TOOL_ARGS)}}
    for first, second in ((ASKS[0], ASKS[1]), (ASKS[1], ASKS[0])):
        steps = [([{"role": "user", "content": first}], CALL_BODY),
                 ([{"role": "assistant", "content": None, "tool_calls": [call]},
                   {"role": "tool", "tool_call_id": "call_0", "content": RESULT}], base.FINAL_TEXT),
                 ([{"role": "assistant", "content": base.FINAL_TEXT}, {"role": "user", "content": second}], CALL_BODY),
                 ([{"role": "assistant", "content": None, "tool_calls": [call]},
                   {"role": "tool", "tool_call_id": "call_0", "content": RESULT}], base.FINAL_TEXT)]
        history: list[dict] = []
        tito_ids: list[int] = []
        for k, (new, target) in enumerate(steps):
            reply_msg = new[0] if k else None
            added = new[1:] if k else new
            if k:  # the token-in prompt: previous prompt + sampled ids + the tail of the new messages
                probe = history + [{"role": "assistant", "content": "\u2063S\u2063"}] + added
                text = q.render(probe, tools)
                tail = text[text.index("<|im_end|>", text.index("\u2063S\u2063")) + len("<|im_end|>"):]
                tito_ids = tito_ids + q.encode(tail)
                history = history + [reply_msg] + added
            else:
                history = list(added)
                tito_ids = q.encode(q.render(history, tools))
            target_ids = q.encode(target) + [q.eos_token_id]
            template_ids = q.encode(q.render(history, tools))
            out.append((template_ids + target_ids, len(template_ids)))
            if k:
                out.append((tito_ids + target_ids, len(tito_ids)))
            tito_ids = tito_ids + target_ids
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--force", action="store_true")
    args = ap.parse_args(argv)

    def log(msg):
        print(f"[build_tiny_qwen3] {msg}", file=sys.stderr, flush=True)

    out = Path(args.out)
    source = out / "overfit"
    target = out / "qwen3"
    tok = load_tokenizer()
    q = Qwen3Tokenizer(tok)
    data = examples(q)
    h = hashlib.sha256(inspect.getsource(sys.modules[__name__]).encode())
    h.update(json.dumps(data).encode())
    h.update((source / "polar_stamp.txt").read_bytes() if (source / "polar_stamp.txt").exists() else b"")
    stamp = h.hexdigest()[:16]
    if not args.force and base.up_to_date(target, stamp):
        log(f"qwen3 model up to date in {target}")
        return 0
    if not (source / "config.json").exists():
        raise SystemExit(f"build the overfit model first ({source} missing)")

    import torch
    from transformers import GenerationConfig, Qwen2ForCausalLM

    torch.manual_seed(base.SEED)
    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    t0 = time.time()
    model = Qwen2ForCausalLM.from_pretrained(str(source), torch_dtype=torch.float32)
    # the loaded generation_config.json says temperature 0 (save() writes it again): transformers
    # refuses to save that without do_sample, so start from a clean one
    model.generation_config = GenerationConfig(eos_token_id=tok.eos_token_id)
    log(f"tuning {source} on {len(data)} calls (both renderings of 4-call sessions)")
    base.MIN_STEPS = 25  # tuning an already overfit model: check early
    steps = base.train(model, q, MAX_STEPS, log, data=data)
    log(f"greedy decoding reproduces every reply after {steps} steps ({time.time() - t0:.0f}s)")
    tmp = Path(tempfile.mkdtemp(prefix=".tok-qwen3-", dir=str(out)))
    try:
        base.save(model, write_tokenizer_dir(tok.path, tmp, QWEN3_TEMPLATE), target, stamp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log(f"qwen3 model -> {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
