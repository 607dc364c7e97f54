#!/usr/bin/env python3
"""Build the tiny Qwen2 models the real-vLLM suite serves. No downloads.

Runs under the vLLM venv's python (torch + transformers), with the repository on PYTHONPATH:

    PYTHONPATH=. ~/.cache/polar_mq/vllm-venv/bin/python scripts/build_tiny_model.py --out DIR

Writes ``DIR/random`` (random init) and ``DIR/overfit`` (the same init overfit with AdamW on a few
fixed chats, loss on the assistant reply only). Both use the stand-in's tokenizer files
(``polar_mq.dev.model_server.tokenizer.load_tokenizer().path``), so the stand-in and vLLM produce directly
comparable token ids. Each directory carries a stamp (hash of this script's training data, config and
the tokenizer files); an up-to-date directory is kept as is unless ``--force``.

The overfit model, decoded greedily, answers (see ``chats`` and ``pi_chats``):
* tools declared, user asks to write a file -> ``<tool_call>`` write polar.txt ``</tool_call>``
* after the tool result                      -> ``FINAL_TEXT``
* no tools                                   -> ``HELLO_TEXT``
* pi's real first-turn prompt (its system prompt + read/bash/edit/write tools, rendered from the
  recorded requests in ``tests/replays/pi/<api>.json`` through the gateway's adapter for each of
  pi's four APIs, with the date, working directory and install path varied and the instruction
  swapped for ``PI_ASKS``)                   -> the same write polar.txt ``<tool_call>`` (pi runs it)
* pi's second turn (``Successfully wrote 16 bytes to polar.txt``) -> ``FINAL_TEXT``

pi's prompt is ~2k tokens (hence ``max_position_embeddings`` 8192, served with ``--max-model-len``
8192): training computes the LM head only at reply positions, batches short chats of similar length
and runs each long one alone (no padding, so no attention mask): ~0.6 s a step on 2 cores, ~100
steps. Training stops once greedy decoding reproduces every reply with p >= MIN_PROB, including on
held-out pi prompts (other dates, paths, instructions) that are never trained on.
The stamp covers the rendered training ids, so a change to the replay, the adapter or the template
rebuilds the models.
"""

from __future__ import annotations

import argparse
import hashlib
import inspect
import json
import os
import random
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from polar_mq.dev.model_server.tokenizer import _prepare_message
from polar_mq.dev.model_server.tokenizer import load_tokenizer  # noqa: E402

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


# ---- pi's real prompt -------------------------------------------------------------------------

PI_REPLAYS = ROOT / "tests" / "replays" / "pi"
# pi's four wire APIs: the gateway's adapters normalise each to the same messages, but the tools
# differ a little (key order, "strict"), so each is trained on
PI_APIS = ["openai_chat", "openai_responses", "anthropic", "gemini"]
PI_ASKS = [
    "Create the file polar.txt",
    "Create the file polar.txt containing hello from polar.",
    "Write hello from polar to polar.txt.",
]
PI_TOOL_RESULT = f"Successfully wrote {len(TOOL_CONTENT)} bytes to {TOOL_PATH}"
PI_TRAIN = 8      # pi prompt variants per turn trained on (2 per API)
PI_HELD_OUT = 4   # and checked (never trained on; 1 per API)
_PI_DATE = re.compile(r"(Current date: )(\S+)")
_PI_CWD = re.compile(r"(Current working directory: )(.*)$", re.M)
_PI_ROOT = re.compile(r"(- Main documentation: )(.*?)/README\.md")


def _pi_recorded(api: str) -> tuple[str, list[dict]]:
    """pi's system prompt and tools, as the gateway's adapter for ``api`` hands them to vLLM (from
    the first recorded request of ``tests/replays/pi/<api>.json``)."""
    import importlib

    adapter = importlib.import_module(f"polar_mq.proxy_app.adapters.{api}")
    body = json.loads((PI_REPLAYS / f"{api}.json").read_text())["requests"][0]["body"]
    req = adapter.to_chat(body)
    system = req.messages[0]
    assert system["role"] == "system" and isinstance(system["content"], str), system
    for pat in (_PI_DATE, _PI_CWD, _PI_ROOT):
        assert pat.search(system["content"]), f"pi's system prompt changed shape: no {pat.pattern!r}"
    assert "write" in {t["function"]["name"] for t in req.tools}, req.tools
    return system["content"], req.tools


def _rand_word(rng: random.Random, n: int) -> str:
    return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz0123456789_") for _ in range(n))


def _pi_variant(rng: random.Random, system: str) -> str:
    """pi's system prompt with another date, working directory and install root (what differs
    between runs: pytest's tmp_path, the harness cache dir, today's date)."""
    date = f"{rng.randint(2025, 2031)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
    cwd = rng.choice([
        lambda: f"/tmp/pytest-of-{rng.choice(['root', 'runner', 'ci'])}/pytest-{rng.randint(0, 999)}/"
                f"test_{_rand_word(rng, rng.randint(4, 24))}{rng.randint(0, 9)}/work",
        lambda: f"/tmp/tmp{_rand_word(rng, 8)}/work",
        lambda: f"/tmp/polar-{_rand_word(rng, 8)}/{_rand_word(rng, rng.randint(3, 10))}",
        lambda: f"/home/{_rand_word(rng, 6)}/src/{_rand_word(rng, rng.randint(3, 12))}",
    ])()
    cache = rng.choice(["/root/.cache/polar_mq", "/home/runner/.cache/polar_mq",
                        f"/tmp/{_rand_word(rng, 10)}/cache", f"/var/cache/{_rand_word(rng, 6)}"])
    old_root = _PI_ROOT.search(system).group(2)  # <cache>/harnesses/pi-<version>/node_modules/...
    root = cache + old_root[old_root.index("/harnesses/"):] if "/harnesses/" in old_root else old_root
    out = _PI_DATE.sub(lambda m: m.group(1) + date, system)
    out = _PI_CWD.sub(lambda m: m.group(1) + cwd, out)
    return out.replace(old_root, root)


def pi_chats(held_out: bool = False) -> list[tuple[list[dict], list[dict] | None, dict]]:
    """pi's two turns on PI_TRAIN (or PI_HELD_OUT) prompt variants, the APIs in turn:
    (messages, tools, reply)."""
    recorded = {api: _pi_recorded(api) for api in PI_APIS}
    rng = random.Random(SEED + (1000 if held_out else 0))
    n = PI_HELD_OUT if held_out else PI_TRAIN
    call = {"id": "call_0", "type": "function",
            "function": {"name": "write", "arguments": json.dumps(TOOL_ARGS, separators=(",", ":"))}}
    out = []
    for i in range(n):
        system, tools = recorded[PI_APIS[i % len(PI_APIS)]]
        ask = PI_ASKS[(i + (1 if held_out else 0)) % len(PI_ASKS)]
        base = [{"role": "system", "content": _pi_variant(rng, system)}, {"role": "user", "content": ask}]
        out.append((base, tools, {"role": "assistant", "content": None, "tool_calls": [call]}))
        base = [{"role": "system", "content": _pi_variant(rng, system)}, {"role": "user", "content": ask}]
        after = base + [
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_0", "content": PI_TOOL_RESULT},
        ]
        out.append((after, tools, {"role": "assistant", "content": FINAL_TEXT}))
    return out


def training_chats() -> list[tuple[list[dict], list[dict] | None, dict]]:
    return chats() + pi_chats()


def model_config(tok):
    from transformers import Qwen2Config

    vocab = ((tok.vocab_size + 63) // 64) * 64
    return Qwen2Config(
        vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=2, head_dim=32, tie_word_embeddings=True,
        max_position_embeddings=MAX_POSITIONS, rms_norm_eps=1e-6, rope_theta=10000.0,
        bos_token_id=tok.special_ids["<|endoftext|>"], eos_token_id=tok.eos_token_id,
        pad_token_id=tok.special_ids["<|endoftext|>"], torch_dtype="float32",
    )


# ---- building --------------------------------------------------------------------------------

MAX_POSITIONS = 8192  # scripts/vllm_cpu.py serves --max-model-len up to this
MAX_STEPS = 400
MIN_STEPS = 75
CHECK_EVERY = 25
MIN_PROB = 0.6
LR = 3e-3
SEED = 0
TOKENIZER_FILES = ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja"]


def stamp_for(tok_dir: Path, kind: str, data_ids: str = "") -> str:
    """Hash of this script, the tokenizer files and (``data_ids``) the rendered training ids."""
    h = hashlib.sha256()
    h.update(kind.encode())
    h.update(inspect.getsource(sys.modules[__name__]).encode())
    for name in TOKENIZER_FILES:
        p = tok_dir / name
        if p.exists():
            h.update(p.read_bytes())
    h.update(data_ids.encode())
    return h.hexdigest()[:16]


def data_digest(*sets: list[tuple[list[int], int]]) -> str:
    h = hashlib.sha256()
    for data in sets:
        h.update(json.dumps(data).encode())
    return h.hexdigest()


def up_to_date(target: Path, stamp: str) -> bool:
    try:
        return (target / "polar_stamp.txt").read_text() == stamp and (target / "config.json").exists()
    except OSError:
        return False


def examples(tok, triples=None) -> list[tuple[list[int], int]]:
    """(ids, number of prompt ids) per chat; the reply is the chat template's assistant body."""
    out = []
    for messages, tools, reply in (training_chats() if triples is None else triples):
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


def _buckets(tok, data, ratio: float = 1.5, alone: int = 512):
    """Batches of similar length (little padding); a sequence longer than ``alone`` tokens (pi's
    ~2k-token prompts) is a batch of its own: without padding there is no attention mask and
    SDPA's causal kernel runs, about twice as fast on CPU as a padded batch."""
    order = sorted(data, key=lambda d: len(d[0]))
    groups: list[list] = []
    for d in order:
        if groups and len(d[0]) <= alone and len(d[0]) <= ratio * len(groups[-1][0][0]):
            groups[-1].append(d)
        else:
            groups.append([d])
    return [_batch(tok, g) for g in groups]


def _reply_logits(model, inp, attn, labels):
    """Logits at the positions that predict a reply token only (the LM head over 2k-token prompts
    would dominate the cost), with their targets."""
    hidden = model.model(input_ids=inp, attention_mask=attn).last_hidden_state[:, :-1]
    tgt = labels[:, 1:]
    mask = tgt != -100
    return model.lm_head(hidden[mask]), tgt[mask]


def greedy_ok(model, batches, min_prob: float = MIN_PROB) -> tuple[bool, float]:
    """Teacher-forced check, equivalent to greedy decoding reproducing every target exactly: at each
    reply position the target token is the argmax (with probability >= min_prob, so that CPU
    kernels' float differences in vLLM cannot flip it)."""
    import torch

    ok, worst = True, 1.0
    with torch.no_grad():
        for inp, attn, labels in batches:
            logits, tgt = _reply_logits(model, inp, attn, labels)
            probs = torch.softmax(logits.float(), dim=-1)
            p_tgt = probs.gather(-1, tgt.unsqueeze(-1)).squeeze(-1)
            ok = ok and bool((logits.argmax(-1) == tgt).all())
            worst = min(worst, float(p_tgt.min()))
    return ok and worst >= min_prob, worst


def train(model, tok, max_steps: int = MAX_STEPS, log=print, data=None, held_out=None) -> int:
    """AdamW on the replies only, until greedy decoding reproduces every reply, of the training
    chats and of the held-out ones (checked every CHECK_EVERY steps from MIN_STEPS on). Returns the
    number of steps taken."""
    import torch
    import torch.nn.functional as F

    batches = _buckets(tok, examples(tok) if data is None else data)
    held = _buckets(tok, held_out) if held_out else []
    n_tgt = sum(int((lab[:, 1:] != -100).sum()) for _, _, lab in batches)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    t0 = time.time()
    for step in range(1, max_steps + 1):
        model.train()
        opt.zero_grad()
        total = 0.0
        for inp, attn, labels in batches:
            logits, tgt = _reply_logits(model, inp, attn, labels)
            loss = F.cross_entropy(logits.float(), tgt, reduction="sum") / n_tgt
            loss.backward()
            total += loss.item()
        opt.step()
        if step >= MIN_STEPS and step % CHECK_EVERY == 0:
            model.eval()
            ok, worst = greedy_ok(model, batches)
            msg = f"  step {step:4d} loss {total:.4f} min p(target) {worst:.3f}"
            if ok and held:
                ok, worst_h = greedy_ok(model, held)
                msg += f", held-out {worst_h:.3f}"
            log(f"{msg} ({time.time() - t0:.0f}s)")
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
    data, held_out = examples(tok), examples(tok, pi_chats(held_out=True))
    digest = data_digest(data, held_out)
    targets = {k: out / k for k in ("random", "overfit")}
    stamps = {k: stamp_for(tok_dir, k, digest) for k in targets}
    if not args.force and all(up_to_date(targets[k], stamps[k]) for k in targets):
        log(f"models up to date in {out}")
        return 0

    import torch
    from transformers import AutoTokenizer, Qwen2ForCausalLM

    torch.manual_seed(SEED)
    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    # transformers must load the stand-in tokenizer and produce the same ids and template
    hf = AutoTokenizer.from_pretrained(str(tok_dir))
    # probes: user ask, tool call, tool result (digits, JSON, newlines); pi's second turn
    # (arguments given as JSON strings, as pi sends them, are parsed first, as vLLM does)
    for probe, tools in ((chats()[1][0], [WRITE_TOOL]), pi_chats()[1][:2]):
        probe = [_prepare_message(m) for m in probe]
        hf_ids = hf.apply_chat_template(probe, tools=tools, add_generation_prompt=True, tokenize=True)
        if isinstance(hf_ids, dict) or hasattr(hf_ids, "keys"):
            hf_ids = hf_ids["input_ids"]
        ours = tok.apply_chat_template(probe, tools=tools, add_generation_prompt=True)
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
    n_pi = len(pi_chats())
    log(f"overfitting on {len(data)} chats ({n_pi} with pi's ~{max(len(i) for i, _ in data)}-token prompt; "
        f"{len(held_out)} held out)")
    steps = train(model, tok, args.max_steps, log, data=data, held_out=held_out)
    log(f"greedy decoding reproduces all {len(data)} replies (and {len(held_out)} held-out) after {steps} steps")
    save(model, tok_dir, targets["overfit"], stamps["overfit"])
    log(f"overfit model -> {targets['overfit']} ({time.time() - t0:.0f}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
