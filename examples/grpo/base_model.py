"""Build the GRPO example's base policy: a tiny Qwen2 (the project's tokenizer, no downloads) that
knows the task's format, can read the instruction, and is unsure of the answer.

    python -m examples.grpo.base_model --out DIR [--seed 0] [--target-p 0.3]

Two supervised phases on every (direction, phrase) chat of ``task.py``, rendered with the same
chat template vLLM serves:

1. *learn*: the reply is the right direction word and the end of turn; the end of turn to
   p >= FORMAT_P and the right direction to p >= HARD_P on every prompt (the model learns to
   read the instruction);
2. *soften*: no training: the LM-head rows of the four direction words are pulled towards their
   mean (one factor, found by bisection) until p(correct) averages ``--target-p``.

So at temperature 1 the model succeeds ~30% of the time while the reading of the instruction is
in its weights, intact (what RL on a pretrained model sharpens). Two earlier recipes (direction
trained to uniform then a little of the task; the direction trained towards a soft target) moved
the whole model, and GRPO's updates then shifted the marginal over the directions instead of the
conditional on the instruction (docs/rl.md, "What did not work"). The result is
cached by a stamp (this file, task.py, the tokenizer, seed, target): rebuilding the same model is
a no-op. Seeded: the same seed gives the same weights on the same torch build.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import inspect
import json
import sys
import time
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from examples.grpo import task  # noqa: E402
from polar_mq.dev.model_server.tokenizer import load_tokenizer  # noqa: E402

FORMAT_P = 0.9995
FINAL_FORMAT_P = 0.999  # the end of turn must stay near-certain (rare sampled format tokens broke the old tool-call format)
LR = 3e-3
CHOICE_TOL = 0.05
HARD_P = 0.9
MAX_LEARN_STEPS = 1000
MAX_POSITIONS = 1024  # served with --max-model-len 1024; prompts are ~200 tokens


def _tiny():
    """scripts/build_tiny_model.py (the project's tiny-model recipe: config, batching, saving)."""
    spec = importlib.util.spec_from_file_location("polar_build_tiny_model", ROOT / "scripts" / "build_tiny_model.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


MULTI_PER_TURN = 48  # multi-turn chats per extra turn (random histories; the model must read the last turn)


def chats(turns: int = 1, seed: int = 0) -> tuple[list, list[str]]:
    """(triples, the right direction of each); a triple is (messages, tools, reply): every
    (direction, phrase) prompt answered with its direction word. ``turns`` > 1 adds, for each
    history length 1..turns-1, ``MULTI_PER_TURN`` conversations whose earlier turns carry random
    instructions and random (often wrong) answers, as a sampling policy leaves them, and whose
    reply is the right direction for the last instruction."""
    import random

    first, answers = [], []
    for d in task.DIRECTIONS:
        for p in range(len(task.PHRASES)):
            first.append((task.first_turn(d, p), None, {"role": "assistant", "content": d}))
            answers.append(d)
    rng = random.Random(seed + 7919)
    for hist in range(1, turns):
        for _ in range(MULTI_PER_TURN):
            msgs = [{"role": "system", "content": task.SYSTEM}]
            for _h in range(hist):
                msgs.append({"role": "user", "content": task.instruction(rng.choice(task.DIRECTIONS),
                                                                         rng.randrange(len(task.PHRASES)))})
                msgs.append({"role": "assistant", "content": rng.choice(task.DIRECTIONS)})
            d = rng.choice(task.DIRECTIONS)
            msgs.append({"role": "user", "content": task.instruction(d, rng.randrange(len(task.PHRASES)))})
            first.append((msgs, None, {"role": "assistant", "content": d}))
            answers.append(d)
    return first, answers


def direction_ids(tok) -> dict[str, int]:
    out = {}
    for d in task.DIRECTIONS:
        ids = tok.encode(d)
        if len(ids) != 1:
            raise SystemExit(f"direction {d!r} is {len(ids)} tokens; the task needs one token per direction")
        out[d] = ids[0]
    return out


def untie(model) -> None:
    """Give the LM head its own copy of the embedding matrix. vLLM 0.32's CPU build keeps a
    separate LM-head tensor for tied embeddings that its in-place ``reload_weights`` does not
    refresh (measured: after a reload the logits still come from the old embedding matrix), so a
    policy that is synced in place must be saved untied."""
    import torch

    model.config.tie_word_embeddings = False
    model.lm_head.weight = torch.nn.Parameter(model.model.embed_tokens.weight.detach().clone())


def stamp(tok_dir: Path, seed: int, target_p: float, turns: int = 1) -> str:
    h = hashlib.sha256()
    for src in (inspect.getsource(sys.modules[__name__]), inspect.getsource(task)):
        h.update(src.encode())
    for name in ("tokenizer.json", "chat_template.jinja", "tokenizer_config.json"):
        p = tok_dir / name
        if p.exists():
            h.update(p.read_bytes())
    h.update(f"{seed}:{target_p}".encode() + (f":{turns}".encode() if turns > 1 else b""))
    return "grpo-base-" + h.hexdigest()[:16]


def build(out: Path, seed: int = 0, target_p: float = 0.3, log=print, turns: int = 1) -> Path:
    import torch
    import torch.nn.functional as F
    from transformers import Qwen2ForCausalLM

    tiny = _tiny()
    tok = load_tokenizer()
    tok_dir = Path(tok.path)
    st = stamp(tok_dir, seed, target_p, turns)
    if tiny.up_to_date(out, st):
        log(f"base model up to date in {out}")
        return out
    torch.manual_seed(seed)
    t0 = time.time()
    dir_ids = direction_ids(tok)
    first, answers = chats(turns, seed)
    data1 = tiny.examples(tok, first)
    # where the direction is chosen in each turn-1 example, and the right id there
    choice = []
    for (ids, n_prompt), answer in zip(data1, answers):
        want = dir_ids[answer]
        pos = [i for i in range(n_prompt, len(ids)) if ids[i] == want]
        assert len(pos) == 1, (tok.decode(ids[n_prompt:]), want)
        choice.append((pos[0], want))
    batch1 = tiny._batch(tok, data1)
    cfg = tiny.model_config(tok)
    cfg.max_position_embeddings = MAX_POSITIONS
    model = Qwen2ForCausalLM(cfg)
    model.generation_config.eos_token_id = tok.eos_token_id
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    all_dirs = torch.tensor(list(dir_ids.values()))
    inp1, attn1, lab1 = batch1
    # the choice position as an index into the flattened "reply positions" of batch 1
    sel = []
    mask = lab1[:, 1:] != -100
    flat_index = torch.cumsum(mask.flatten().long(), 0) - 1
    for row, (pos, _) in enumerate(choice):
        sel.append(int(flat_index[row * mask.shape[1] + pos - 1]))
    sel_t = torch.tensor(sel)

    def losses():
        logits, tgt = tiny._reply_logits(model, inp1, attn1, lab1)
        logp = F.log_softmax(logits.float(), -1)
        tok_lp = logp.gather(-1, tgt.unsqueeze(-1)).squeeze(-1)
        is_choice = torch.zeros_like(tok_lp, dtype=torch.bool)
        is_choice[sel_t] = True
        fmt = -tok_lp[~is_choice]
        choice_loss = -tok_lp[sel_t]
        loss = torch.cat([fmt, choice_loss]).mean()
        p_correct = tok_lp[sel_t].detach().exp()
        fmt_min = float(torch.exp(-fmt.detach().max()))
        return loss, p_correct, fmt_min

    # phase 1, learn the task: every format token to p >= FORMAT_P and the right direction to
    # p >= HARD_P on every prompt (the model learns to read the instruction)
    for step in range(1, MAX_LEARN_STEPS + 1):
        opt.zero_grad()
        loss, p_corr, fmt_min = losses()
        loss.backward()
        opt.step()
        if step % 25 == 0:
            log(f"  learn {step:4d} loss {loss.item():.4f} p(correct) mean {float(p_corr.mean()):.3f} "
                f"min {float(p_corr.min()):.3f} format min {fmt_min:.6f} ({time.time() - t0:.0f}s)")
            if fmt_min >= FORMAT_P and float(p_corr.min()) >= HARD_P:
                break
    else:
        raise SystemExit("base model: the learning phase did not converge")
    # phase 2, make it unsure without unlearning the reading: the LM-head rows of the four
    # directions are pulled towards their mean (logit_d -> m + alpha * (logit_d - m), m the mean
    # of the four), alpha found by bisection so that p(correct) averages target_p. The hidden
    # state still encodes the instruction's direction exactly as phase 1 learnt it; GRPO has to
    # find the one way back (raise alpha), the situation of RL on a pretrained model that knows
    # the answer but is unsure of it. An earlier recipe trained the direction towards a soft
    # target instead: that moved the whole model and GRPO's updates then mostly shifted the
    # marginal over the directions, not the conditional on the instruction (docs/rl.md).
    model.eval()
    untie(model)
    rows_w = model.lm_head.weight.data[all_dirs].clone()
    centre = rows_w.mean(0, keepdim=True)

    def at(alpha: float):
        model.lm_head.weight.data[all_dirs] = centre + alpha * (rows_w - centre)
        with torch.no_grad():
            _, p_corr, fmt_min = losses()
        return float(p_corr.mean()), p_corr, fmt_min

    alpha = soften_alpha(lambda a: at(a)[0], target_p, iterations=40)
    mean_p, p_corr, fmt_min = at(alpha)
    with torch.no_grad():
        logits, _ = tiny._reply_logits(model, inp1, attn1, lab1)
        p_dirs = torch.softmax(logits.float(), -1)[sel_t][:, all_dirs].sum(-1)
    log(f"  soften: alpha {alpha:.4f} p(correct) mean {mean_p:.3f} min {float(p_corr.min()):.3f} "
        f"max {float(p_corr.max()):.3f}, p(any direction) min {float(p_dirs.min()):.4f}, format min {fmt_min:.6f}")
    if fmt_min < FINAL_FORMAT_P or abs(mean_p - target_p) > CHOICE_TOL:
        raise SystemExit(f"base model: softening missed (p {mean_p:.3f}, format {fmt_min:.6f})")
    tiny.save(model, tok_dir, out, st)
    info = {"mean_p_correct": mean_p, "format_min_p": fmt_min, "alpha": alpha,
            "p_any_direction_min": float(p_dirs.min()), "seed": seed, "turns": turns,
            "seconds": round(time.time() - t0, 1)}
    (out / "grpo_base.json").write_text(json.dumps(info, indent=2))
    log(f"base model -> {out} {info}")
    return out


def soften_alpha(mean_p_at: Callable[[float], float], target_p: float, iterations: int = 30) -> float:
    """The alpha in [0, 1] at which the four direction rows, pulled towards their mean
    (``centre + alpha * (row - centre)``), give p(correct) ``target_p`` on average: bisection, since
    p(correct) rises with alpha (at 0 the four are one row)."""
    lo, hi = 0.0, 1.0
    for _ in range(iterations):
        mid = (lo + hi) / 2
        if mean_p_at(mid) < target_p:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--target-p", type=float, default=0.3)
    ap.add_argument("--turns", type=int, default=1, help="also learn multi-turn chats of up to this many turns")
    args = ap.parse_args(argv)
    import torch
    torch.set_num_threads(1)  # see trainer.py: one thread is faster on a busy 2-core box
    build(Path(args.out), args.seed, args.target_p, log=lambda m: print(f"[grpo base] {m}", file=sys.stderr, flush=True),
          turns=args.turns)
    return 0


if __name__ == "__main__":
    sys.exit(main())
