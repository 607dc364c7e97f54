"""Build the GRPO example's base policy: a tiny Qwen2 (the project's tokenizer, no downloads) that
knows the task's format, can read the instruction, and is unsure of the answer.

    python -m examples.grpo.base_model --out DIR [--seed 0] [--target-p 0.3]

Two supervised phases on every (direction, phrase) chat of ``task.py``, rendered with the same
chat template vLLM serves:

1. *learn*: turn 1 -> the ``move`` tool call with the right direction, turn 2 (after the tool
   result, whatever it says) -> ``Done.``; every format token to p >= FORMAT_P and the right
   direction to p >= HARD_P on every prompt (the model learns to read the instruction);
2. *soften*: the direction trained towards a soft target (``--target-p`` on the right one, the
   rest spread over the other three) until every prompt is within CHOICE_TOL of it.

So at temperature 1 the model succeeds ~30% of the time while the reading of the instruction is
in its weights (what RL on a pretrained model sharpens). An earlier recipe (direction trained to
uniform, then a little of the task) left the model at the onset of learning to read the
instruction, and no GRPO setting tried here improved it (docs/rl.md, Status). The result is
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

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from examples.grpo import task  # noqa: E402
from polar_mq.model_server.tokenizer import load_tokenizer  # noqa: E402

FORMAT_P = 0.99
FINAL_FORMAT_P = 0.97  # after the task phase (its weighted-up choice loss costs a little format)
CHOICE_WEIGHT = 20
LR = 3e-3
CHOICE_TOL = 0.05
HARD_P = 0.9
SOFT_LR = 1e-3
MAX_SOFT_STEPS = 400
MAX_LEARN_STEPS = 1000
MAX_POSITIONS = 1024  # served with --max-model-len 1024; prompts are ~200 tokens


def _tiny():
    """scripts/build_tiny_model.py (the project's tiny-model recipe: config, batching, saving)."""
    spec = importlib.util.spec_from_file_location("polar_build_tiny_model", ROOT / "scripts" / "build_tiny_model.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def chats() -> tuple[list, list, list[str]]:
    """(turn-1 triples, turn-2 triples, the right direction of each turn-1 triple); a triple is
    (messages, tools, reply). Turn 2 says Done whatever was moved: each prompt is paired with
    one moved direction, rotating, so all 16 (asked, moved) pairs occur."""
    first, second, answers = [], [], []
    for di, d in enumerate(task.DIRECTIONS):
        for p in range(len(task.PHRASES)):
            base = task.first_turn(d, p)
            first.append((base, task.TOOLS, {"role": "assistant", "content": None,
                                             "tool_calls": [task.tool_call(d)]}))
            answers.append(d)
            for moved in [task.DIRECTIONS[(di + p) % len(task.DIRECTIONS)]]:
                after = base + [{"role": "assistant", "content": None, "tool_calls": [task.tool_call(moved)]},
                                {"role": "tool", "tool_call_id": "call_0", "content": task.tool_result(moved)}]
                second.append((after, task.TOOLS, {"role": "assistant", "content": task.DONE_TEXT}))
    return first, second, answers


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


def stamp(tok_dir: Path, seed: int, target_p: float) -> str:
    h = hashlib.sha256()
    for src in (inspect.getsource(sys.modules[__name__]), inspect.getsource(task)):
        h.update(src.encode())
    for name in ("tokenizer.json", "chat_template.jinja", "tokenizer_config.json"):
        p = tok_dir / name
        if p.exists():
            h.update(p.read_bytes())
    h.update(f"{seed}:{target_p}".encode())
    return "grpo-base-" + h.hexdigest()[:16]


def build(out: Path, seed: int = 0, target_p: float = 0.3, log=print) -> Path:
    import torch
    import torch.nn.functional as F
    from transformers import Qwen2ForCausalLM

    tiny = _tiny()
    tok = load_tokenizer()
    tok_dir = Path(tok.path)
    st = stamp(tok_dir, seed, target_p)
    if tiny.up_to_date(out, st):
        log(f"base model up to date in {out}")
        return out
    torch.manual_seed(seed)
    t0 = time.time()
    dir_ids = direction_ids(tok)
    first, second, answers = chats()
    data1, data2 = tiny.examples(tok, first), tiny.examples(tok, second)
    # where the direction is chosen in each turn-1 example, and the right id there
    choice = []
    for (ids, n_prompt), answer in zip(data1, answers):
        want = dir_ids[answer]
        pos = [i for i in range(n_prompt, len(ids)) if ids[i] == want]
        assert len(pos) == 1, (tok.decode(ids[n_prompt:]), want)
        choice.append((pos[0], want))
    batch1 = tiny._batch(tok, data1)
    batch2 = tiny._buckets(tok, data2)
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
    want_t = torch.tensor([w for _, w in choice])

    # the soft target at each choice: target_p on the instruction's direction, the rest spread
    # evenly over the other three (so the model must read the instruction to meet it)
    want_col = torch.tensor([list(dir_ids.values()).index(w) for w in want_t.tolist()])
    soft = torch.full((len(choice), len(all_dirs)), (1.0 - target_p) / (len(all_dirs) - 1))
    soft[torch.arange(len(choice)), want_col] = target_p

    def losses(hard: bool):
        logits, tgt = tiny._reply_logits(model, inp1, attn1, lab1)
        logp = F.log_softmax(logits.float(), -1)
        tok_lp = logp.gather(-1, tgt.unsqueeze(-1)).squeeze(-1)
        is_choice = torch.zeros_like(tok_lp, dtype=torch.bool)
        is_choice[sel_t] = True
        fmt = -tok_lp[~is_choice]
        if hard:
            choice_loss = -tok_lp[sel_t]
        else:
            choice_loss = -(soft * logp[sel_t][:, all_dirs]).sum(-1)  # CE against the soft target
        # the choice is 1 token in ~40: weighted up, or the copy (attend to the instruction's
        # direction word) is learnt far more slowly than the format
        parts = [fmt, choice_loss.repeat(CHOICE_WEIGHT)]
        for inp, attn, lab in batch2:
            lg, tg = tiny._reply_logits(model, inp, attn, lab)
            parts.append(F.cross_entropy(lg.float(), tg, reduction="none"))
        loss = torch.cat(parts).mean()
        p_correct = tok_lp[sel_t].detach().exp()
        fmt_min = float(torch.exp(-fmt.detach().max()))
        return loss, p_correct, fmt_min

    def turn2_min() -> float:
        worst = 1.0
        with torch.no_grad():
            for inp, attn, lab in batch2:
                lg, tg = tiny._reply_logits(model, inp, attn, lab)
                worst = min(worst, float(torch.softmax(lg.float(), -1).gather(-1, tg.unsqueeze(-1)).min()))
        return worst

    # phase 1, learn the task: every format token to p >= FORMAT_P and the right direction to
    # p >= HARD_P on every prompt (the model learns to read the instruction)
    for step in range(1, MAX_LEARN_STEPS + 1):
        opt.zero_grad()
        loss, p_corr, fmt_min = losses(hard=True)
        loss.backward()
        opt.step()
        if step % 25 == 0:
            t2 = turn2_min()
            log(f"  learn {step:4d} loss {loss.item():.4f} p(correct) mean {float(p_corr.mean()):.3f} "
                f"min {float(p_corr.min()):.3f} format min {fmt_min:.4f} turn-2 min {t2:.4f} ({time.time() - t0:.0f}s)")
            if fmt_min >= FORMAT_P and t2 >= FORMAT_P and float(p_corr.min()) >= HARD_P:
                break
    else:
        raise SystemExit("base model: the learning phase did not converge")
    # phase 2, unlearn the confidence: the soft target (target_p on the right direction, the rest
    # spread over the other three) until every prompt is within CHOICE_TOL of it. The reading of
    # the instruction stays; at temperature 1 the model is right ~target_p of the time.
    for group in opt.param_groups:
        group["lr"] = SOFT_LR
    for step in range(1, MAX_SOFT_STEPS + 1):
        opt.zero_grad()
        loss, p_corr, fmt_min = losses(hard=False)
        mean_p = float(p_corr.mean())
        spread = float((p_corr - target_p).abs().max())
        if spread <= CHOICE_TOL and fmt_min >= FINAL_FORMAT_P:
            log(f"  soften {step:4d}: p(correct) mean {mean_p:.3f} (target {target_p}, worst off by {spread:.3f}), "
                f"format min {fmt_min:.4f}")
            break
        loss.backward()
        opt.step()
        if step % 10 == 0:
            log(f"  soften {step:4d} p(correct) mean {mean_p:.3f} worst off by {spread:.3f} format min {fmt_min:.4f}")
    else:
        raise SystemExit("base model: the softening phase did not reach the target")
    t2 = turn2_min()
    if t2 < FINAL_FORMAT_P or fmt_min < FINAL_FORMAT_P:
        raise SystemExit(f"base model: turn 2 degraded (min p {t2:.4f})")
    model.eval()
    untie(model)
    tiny.save(model, tok_dir, out, st)
    info = {"mean_p_correct": mean_p, "format_min_p": fmt_min, "turn2_min_p": t2, "seed": seed,
            "seconds": round(time.time() - t0, 1)}
    (out / "grpo_base.json").write_text(json.dumps(info, indent=2))
    log(f"base model -> {out} {info}")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--target-p", type=float, default=0.3)
    args = ap.parse_args(argv)
    import torch
    torch.set_num_threads(1)  # see trainer.py: one thread is faster on a busy 2-core box
    build(Path(args.out), args.seed, args.target_p, log=lambda m: print(f"[grpo base] {m}", file=sys.stderr, flush=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
