#!/usr/bin/env python3
"""Build the tiny Qwen2 models the real-vLLM suite serves. No downloads.

Runs under the vLLM venv's python (torch + transformers), with the repository on PYTHONPATH:

    PYTHONPATH=. ~/.cache/polar_mq/vllm-venv/bin/python scripts/build_tiny_model.py --out DIR

Writes ``DIR/random`` (random init) and ``DIR/overfit`` (the same init overfit with AdamW on a few
fixed chats, loss on the assistant reply only). Both use the stand-in's tokenizer files
(``polar_mq.model_server.tokenizer.load_tokenizer().path``), so the stand-in and vLLM produce directly
comparable token ids. Each directory carries a stamp (hash of this script's training data, config and
the tokenizer files); an up-to-date directory is kept as is unless ``--force``.

The overfit model, decoded greedily, answers (see ``CHATS``):
* tools declared, user asks to write a file -> ``<tool_call>`` write polar.txt ``</tool_call>``
* after the tool result                      -> ``FINAL_TEXT``
* no tools                                   -> ``HELLO_TEXT``
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
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from polar_mq.model_server.tokenizer import load_tokenizer  # noqa: E402

# ---- what the overfit model must say ---------------------------------------------------------

TOOL_PATH = "polar.txt"
TOOL_CONTENT = "hello from polar"
TOOL_ARGS = {"path": TOOL_PATH, "content": TOOL_CONTENT}
FINAL_TEXT = "Done. I wrote polar.txt."
HELLO_TEXT = "Hello from the tiny model."
TOOL_RESULT = "Wrote 16 bytes to polar.txt"

WRITE_TOOL = {
    "type": "function",
    "function": {
        "name": "write",
        "description": "Write content to a file.",
        "parameters": {
            "type": "object",
            "properties": {
                "path": {"type": "string", "description": "File path"},
                "content": {"type": "string", "description": "File content"},
            },
            "required": ["path", "content"],
        },
    },
}

USER_ASKS = [
    "Write hello from polar to polar.txt.",
    "Please create the file polar.txt containing 'hello from polar'.",
    "write a file",
    "Use the write tool to write polar.txt",
]
SYSTEMS = [None, "You are a helpful assistant.", "You are a coding agent. Use tools when needed."]
PLAIN_ASKS = ["Say hello.", "hi", "Hello! Who are you?"]


def _tool_variants() -> list[list[dict]]:
    """The same write tool as different providers' adapters may normalise it."""
    bare = json.loads(json.dumps(WRITE_TOOL))
    no_desc = json.loads(json.dumps(WRITE_TOOL))
    no_desc["function"].pop("description")
    strict = json.loads(json.dumps(WRITE_TOOL))
    strict["function"]["parameters"]["additionalProperties"] = False
    return [[bare], [no_desc], [strict]]


def chats() -> list[tuple[list[dict], list[dict] | None, dict]]:
    """(messages, tools, assistant message) triples."""
    out = []
    call = {"id": "call_0", "type": "function",
            "function": {"name": "write", "arguments": json.dumps(TOOL_ARGS)}}
    for si, system in enumerate(SYSTEMS):
        for ui, ask in enumerate(USER_ASKS):
            tools = _tool_variants()[(si + ui) % 3]
            base = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": ask}]
            out.append((base, tools, {"role": "assistant", "content": None, "tool_calls": [call]}))
            after = base + [
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "call_0", "content": TOOL_RESULT},
            ]
            out.append((after, tools, {"role": "assistant", "content": FINAL_TEXT}))
        for ask in PLAIN_ASKS:
            base = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": ask}]
            out.append((base, None, {"role": "assistant", "content": HELLO_TEXT}))
    return out


def model_config(tok):
    from transformers import Qwen2Config

    vocab = ((tok.vocab_size + 63) // 64) * 64
    return Qwen2Config(
        vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=2, head_dim=32, tie_word_embeddings=True,
        max_position_embeddings=4096, rms_norm_eps=1e-6, rope_theta=10000.0,
        bos_token_id=tok.special_ids["<|endoftext|>"], eos_token_id=tok.eos_token_id,
        pad_token_id=tok.special_ids["<|endoftext|>"], torch_dtype="float32",
    )


# ---- building --------------------------------------------------------------------------------

MAX_STEPS = 400
MIN_STEPS = 75
CHECK_EVERY = 25
MIN_PROB = 0.6
LR = 3e-3
SEED = 0
TOKENIZER_FILES = ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja"]


def stamp_for(tok_dir: Path, kind: str) -> str:
    h = hashlib.sha256()
    h.update(kind.encode())
    h.update(inspect.getsource(sys.modules[__name__]).encode())
    for name in TOKENIZER_FILES:
        p = tok_dir / name
        if p.exists():
            h.update(p.read_bytes())
    return h.hexdigest()[:16]


def up_to_date(target: Path, stamp: str) -> bool:
    try:
        return (target / "polar_stamp.txt").read_text() == stamp and (target / "config.json").exists()
    except OSError:
        return False


def examples(tok) -> list[tuple[list[int], int]]:
    """(ids, number of prompt ids) per chat; the reply is the chat template's assistant body."""
    out = []
    for messages, tools, reply in chats():
        prompt = tok.render(messages, tools=tools, add_generation_prompt=True)
        full = tok.render(messages + [reply], tools=tools, add_generation_prompt=False)
        assert full.startswith(prompt) and full.endswith("<|im_end|>\n"), (prompt, full)
        body = full[len(prompt):-len("<|im_end|>\n")]
        p_ids = tok.encode(prompt)
        ids = p_ids + tok.encode(body) + [tok.eos_token_id]
        out.append((ids, len(p_ids)))
    return out


def _batch(tok, data):
    import torch

    maxlen = max(len(ids) for ids, _ in data)
    pad = tok.special_ids["<|endoftext|>"]
    inp = torch.full((len(data), maxlen), pad, dtype=torch.long)
    labels = torch.full((len(data), maxlen), -100, dtype=torch.long)
    attn = torch.zeros((len(data), maxlen), dtype=torch.long)
    for i, (ids, n_prompt) in enumerate(data):
        inp[i, : len(ids)] = torch.tensor(ids)
        attn[i, : len(ids)] = 1
        labels[i, n_prompt: len(ids)] = torch.tensor(ids[n_prompt:])
    return inp, attn, labels


def greedy_ok(model, inp, attn, labels, min_prob: float = MIN_PROB) -> tuple[bool, float]:
    """Teacher-forced check, equivalent to greedy decoding reproducing every target exactly: at each
    reply position the target token is the argmax (with probability >= min_prob, so that CPU
    kernels' float differences in vLLM cannot flip it)."""
    import torch

    with torch.no_grad():
        logits = model(input_ids=inp, attention_mask=attn).logits[:, :-1]
    tgt = labels[:, 1:]
    mask = tgt != -100
    probs = torch.softmax(logits.float(), dim=-1)
    p_tgt = probs.gather(-1, tgt.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    argmax_ok = (logits.argmax(-1) == tgt) | ~mask
    worst = float(p_tgt[mask].min())
    return bool(argmax_ok.all()) and worst >= min_prob, worst


def train(model, tok, max_steps: int = MAX_STEPS, log=print) -> int:
    """AdamW on the replies only, until greedy decoding reproduces every reply (checked every
    CHECK_EVERY steps from MIN_STEPS on). Returns the number of steps taken."""
    import torch

    data = examples(tok)
    inp, attn, labels = _batch(tok, data)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    t0 = time.time()
    for step in range(1, max_steps + 1):
        model.train()
        out = model(input_ids=inp, attention_mask=attn, labels=labels)
        opt.zero_grad()
        out.loss.backward()
        opt.step()
        if step >= MIN_STEPS and step % CHECK_EVERY == 0:
            model.eval()
            ok, worst = greedy_ok(model, inp, attn, labels)
            log(f"  step {step:4d} loss {out.loss.item():.4f} min p(target) {worst:.3f} ({time.time() - t0:.0f}s)")
            if ok:
                return step
    model.eval()
    raise SystemExit(f"greedy decoding does not reproduce the replies after {max_steps} steps")


def save(model, tok_dir: Path, target: Path, stamp: str) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=str(target.parent)))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        # The tokenizer files sit next to the weights (HF layout) AND alone in tokenizer/: with a
        # config.json of model_type qwen2, transformers 5 forces its Qwen2Tokenizer, whose own
        # pre-tokeniser (digits split one by one, ...) gives other ids than tokenizer.json. Serve with
        # `--tokenizer DIR/tokenizer` (scripts/vllm_cpu.py does) to get exactly the stand-in's ids.
        (tmp / "tokenizer").mkdir()
        for name in TOKENIZER_FILES:
            if (tok_dir / name).exists():
                shutil.copy2(tok_dir / name, tmp / name)
                shutil.copy2(tok_dir / name, tmp / "tokenizer" / name)
        # vLLM takes its default sampling parameters from generation_config.json: greedy, so that
        # clients that send no temperature (agent CLIs, SDK calls) get deterministic answers
        gc = tmp / "generation_config.json"
        cfg = json.loads(gc.read_text()) if gc.exists() else {}
        for k in ("top_p", "top_k", "repetition_penalty", "do_sample"):
            cfg.pop(k, None)
        cfg["temperature"] = 0.0
        gc.write_text(json.dumps(cfg, indent=2))
        (tmp / "polar_stamp.txt").write_text(stamp)
        if target.exists():
            shutil.rmtree(target)
        os.rename(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--force", action="store_true")
    ap.add_argument("--max-steps", type=int, default=MAX_STEPS)
    args = ap.parse_args(argv)

    def log(msg: str) -> None:
        print(f"[build_tiny_model] {msg}", file=sys.stderr, flush=True)

    out = Path(args.out)
    tok = load_tokenizer()
    tok_dir = Path(tok.path)
    targets = {k: out / k for k in ("random", "overfit")}
    stamps = {k: stamp_for(tok_dir, k) for k in targets}
    if not args.force and all(up_to_date(targets[k], stamps[k]) for k in targets):
        log(f"models up to date in {out}")
        return 0

    import torch
    from transformers import AutoTokenizer, Qwen2ForCausalLM

    torch.manual_seed(SEED)
    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    # transformers must load the stand-in tokenizer and produce the same ids and template
    hf = AutoTokenizer.from_pretrained(str(tok_dir))
    probe = chats()[1][0]  # user ask, tool call, tool result (digits, JSON, newlines)
    hf_ids = hf.apply_chat_template(probe, tools=[WRITE_TOOL], add_generation_prompt=True, tokenize=True)
    if isinstance(hf_ids, dict) or hasattr(hf_ids, "keys"):
        hf_ids = hf_ids["input_ids"]
    ours = tok.apply_chat_template(probe, tools=[WRITE_TOOL], add_generation_prompt=True)
    if list(hf_ids) != ours:
        raise SystemExit("transformers renders/tokenises the stand-in template differently")
    if hf.eos_token_id != tok.eos_token_id:
        raise SystemExit(f"eos mismatch: transformers {hf.eos_token_id} vs stand-in {tok.eos_token_id}")

    t0 = time.time()
    cfg = model_config(tok)
    model = Qwen2ForCausalLM(cfg)
    model.generation_config.eos_token_id = tok.eos_token_id
    save(model, tok_dir, targets["random"], stamps["random"])
    log(f"random model -> {targets['random']}")
    log(f"overfitting on {len(chats())} chats")
    steps = train(model, tok, args.max_steps, log)
    log(f"greedy decoding reproduces all {len(chats())} replies after {steps} steps")
    save(model, tok_dir, targets["overfit"], stamps["overfit"])
    log(f"overfit model -> {targets['overfit']} ({time.time() - t0:.0f}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
