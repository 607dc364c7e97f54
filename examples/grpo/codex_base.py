"""The base policy for the cursor task through the real Codex CLI: a tiny Qwen2 (the project's
tokenizer, no downloads) trained on Codex's own captured prompt, unsure of the direction.

    python -m examples.grpo.codex_base --out DIR [--seed 0] [--target-p 0.3]

The recipe of ``base_model.py`` on Codex's wire: the prompt of every example is the request the
pinned Codex CLI sends (``codex_task.capture``: its instructions file, its ``exec_command`` /
``write_stdin`` tools, converted by the gateway's Responses adapter and rendered with the chat
template vLLM serves), with the user message one of the task's instructions.

1. *learn*: turn 1's reply is the hermes tool call ``exec_command`` with ``echo <direction> >
   answer.txt``; turn 2 (after Codex's tool output, for any direction the history wrote) is
   ``codex_task.FINAL_TEXT`` and the end of turn. Every format token to p >= FORMAT_P and the right
   direction to p >= HARD_P on every prompt;
2. *soften*: the LM-head rows of the four tokens where the directions part in the command are
   pulled towards their mean until p(correct) averages ``--target-p``.

The ~930 shared prompt tokens run once per step (``prefix_forward``). Cached by a stamp (this file,
task.py, codex_task.py, the captured prompt, the tokenizer, seed, target).
"""

from __future__ import annotations

import argparse
import hashlib
import inspect
import json
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from examples.grpo import codex_task, task  # noqa: E402
from examples.grpo.base_model import _tiny, untie  # noqa: E402
from examples.grpo.prefix_forward import hidden_states  # noqa: E402
from polar_mq.dev.model_server.tokenizer import load_tokenizer  # noqa: E402

# every format token (~25 in the tool call, ~4 in the final text) to p >= FORMAT_P: with ~1k-token
# prompts the last per-mille is slow (0.98 after 270 steps, +0.001 per 10 steps), and the reward
# depends on the tool call alone (the answer file), not on how the final text is worded
FORMAT_P = 0.98
FINAL_FORMAT_P = 0.97
HARD_P = 0.9
LR = 3e-3
CHOICE_TOL = 0.05
MAX_LEARN_STEPS = 800
MAX_POSITIONS = 4096
SECOND_TURNS = 24  # turn-2 examples (random direction in the history, fresh tool outputs)


def chats(body: dict, seed: int) -> tuple[list, list[str | None]]:
    """(triples (messages, tools, reply), the right direction of each turn-1 triple / None for turn 2)."""
    out, answers = [], []
    for d in task.DIRECTIONS:
        for p in range(len(task.PHRASES)):
            messages, tools = codex_task.first_turn(body, task.instruction(d, p))
            out.append((messages, tools, codex_task.tool_call(d)))
            answers.append(d)
    rng = random.Random(seed + 104729)
    for _ in range(SECOND_TURNS):
        d, p = rng.choice(task.DIRECTIONS), rng.randrange(len(task.PHRASES))
        messages, tools = codex_task.second_turn(body, task.instruction(d, p), rng.choice(task.DIRECTIONS), rng)
        out.append((messages, tools, {"role": "assistant", "content": codex_task.FINAL_TEXT}))
        answers.append(None)
    return out, answers


def stamp(tok_dir: Path, body: dict, seed: int, target_p: float) -> str:
    h = hashlib.sha256()
    for mod in (sys.modules[__name__], task, codex_task):
        h.update(inspect.getsource(mod).encode())
    h.update(json.dumps(codex_task.prompt_key(body), sort_keys=True).encode())
    for name in ("tokenizer.json", "chat_template.jinja", "tokenizer_config.json"):
        p = tok_dir / name
        if p.exists():
            h.update(p.read_bytes())
    h.update(f"{seed}:{target_p}".encode())
    return "grpo-codex-base-" + h.hexdigest()[:16]


def build(out: Path, seed: int = 0, target_p: float = 0.3, log=print, body: dict | None = None) -> Path:
    import torch
    import torch.nn.functional as F
    from transformers import Qwen2ForCausalLM

    tiny = _tiny()
    tok = load_tokenizer()
    tok_dir = Path(tok.path)
    if body is None:
        body = codex_task.capture()
    st = stamp(tok_dir, body, seed, target_p)
    if tiny.up_to_date(out, st):
        log(f"codex base model up to date in {out}")
        return out
    torch.manual_seed(seed)
    t0 = time.time()
    triples, answers = chats(body, seed)
    data = tiny.examples(tok, triples)
    # where the directions part in turn 1's command, and the token of each direction there
    n_phr = len(task.PHRASES)
    by_prompt = {p: {d: data[i * n_phr + p][0][data[i * n_phr + p][1]:] for i, d in enumerate(task.DIRECTIONS)}
                 for p in range(n_phr)}  # chats(): turn 1 first, direction-major
    split = None
    for replies in by_prompt.values():
        k = 0
        seqs = list(replies.values())
        while all(len(s) > k and s[k] == seqs[0][k] for s in seqs):
            k += 1
        split = k if split is None else split
        if k != split:
            raise SystemExit("codex base: the directions part at different reply tokens")
    first_reply = next(iter(by_prompt.values()))
    dir_tok = {d: first_reply[d][split] for d in task.DIRECTIONS}
    if len(set(dir_tok.values())) != 4:
        raise SystemExit(f"codex base: direction tokens not distinct: {dir_tok}")
    pad = tok.special_ids["<|endoftext|>"]
    cfg = tiny.model_config(tok)
    cfg.max_position_embeddings = MAX_POSITIONS
    model = Qwen2ForCausalLM(cfg)
    model.generation_config.eos_token_id = tok.eos_token_id
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    all_dirs = torch.tensor(list(dir_tok.values()))

    def objective(data):
        """losses() over ``data``: (loss, p(correct) per turn-1 example, min p of a format token, logits)."""
        seqs = [ids for ids, _ in data]
        first_needed = min(n_p for _, n_p in data) - 1
        pos, tgt, sel = [], [], []
        for i, (ids, n_p) in enumerate(data):
            for t in range(n_p, len(ids)):
                if answers[i] is not None and t == n_p + split:
                    sel.append(len(pos))
                pos.append((i, t - 1))
                tgt.append(ids[t])
        rows_t, tgt_t, sel_t = torch.tensor([r for r, _ in pos]), torch.tensor(tgt), torch.tensor(sel)

        def losses():
            hidden, off = hidden_states(model, seqs, pad, first_needed)
            logits = model.lm_head(hidden[rows_t, torch.tensor([c - off for _, c in pos])])
            logp = F.log_softmax(logits.float(), -1)
            tok_lp = logp.gather(-1, tgt_t.unsqueeze(-1)).squeeze(-1)
            is_choice = torch.zeros_like(tok_lp, dtype=torch.bool)
            is_choice[sel_t] = True
            fmt = -tok_lp[~is_choice]
            # the format and the choice weigh the same (as in base_model.py, where the reply is two
            # tokens): averaged over every token, 24 choices among ~1.5k format tokens never learn to
            # read the instruction (p(correct) stayed at 0.25 for 180 steps)
            loss = fmt.mean() + (-tok_lp[sel_t]).mean()
            return loss, tok_lp[sel_t].detach().exp(), float(torch.exp(-fmt.detach().max())), logits[sel_t]
        return losses, seqs

    def learn(losses, name: str, hard_p: float, format_p: float) -> None:
        for step in range(1, MAX_LEARN_STEPS + 1):
            opt.zero_grad()
            loss, p_corr, fmt_min, _ = losses()
            loss.backward()
            opt.step()
            if step % 10 == 0:
                per_dir = " ".join(f"{d} {float(p_corr[i * n_phr:(i + 1) * n_phr].mean()):.2f}"
                                   for i, d in enumerate(task.DIRECTIONS))
                log(f"  {name} {step:4d} loss {loss.item():.4f} p(correct) mean {float(p_corr.mean()):.3f} "
                    f"min {float(p_corr.min()):.3f} ({per_dir}) format min {fmt_min:.6f} ({time.time() - t0:.0f}s)")
                if fmt_min >= format_p and float(p_corr.min()) >= hard_p:
                    return
        raise SystemExit(f"codex base: the {name} phase did not converge")

    # phase 0, reading on short prompts (the same chats without the tool schemas, ~40 tokens): a
    # head that finds the instruction's direction among ~950 prompt tokens gets 1/950 of the
    # gradient while attention is uniform; on the full prompts alone p(correct) stalled at 0.45
    short, _ = objective(tiny.examples(tok, [(m, None, r) for m, _, r in triples]))
    learn(short, "read", HARD_P, 0.0)
    losses, seqs = objective(data)
    log(f"codex base: {len(data)} examples, prompts {min(len(s) for s in seqs)}-{max(len(s) for s in seqs)} tokens, "
        f"directions part at reply token {split}: {dir_tok}")
    learn(losses, "learn", HARD_P, FORMAT_P)
    model.eval()
    untie(model)
    rows_w = model.lm_head.weight.data[all_dirs].clone()
    centre = rows_w.mean(0, keepdim=True)

    def at(alpha: float):
        model.lm_head.weight.data[all_dirs] = centre + alpha * (rows_w - centre)
        with torch.no_grad():
            _, p_corr, fmt_min, logits = losses()
        return float(p_corr.mean()), p_corr, fmt_min, logits

    lo, hi = 0.0, 1.0
    for _ in range(30):
        mid = (lo + hi) / 2
        if at(mid)[0] < target_p:
            lo = mid
        else:
            hi = mid
    alpha = (lo + hi) / 2
    mean_p, p_corr, fmt_min, logits = at(alpha)
    p_dirs = torch.softmax(logits.float(), -1)[:, all_dirs].sum(-1)
    log(f"  soften: alpha {alpha:.4f} p(correct) mean {mean_p:.3f} min {float(p_corr.min()):.3f} "
        f"max {float(p_corr.max()):.3f}, p(any direction) min {float(p_dirs.min()):.4f}, format min {fmt_min:.6f}")
    if fmt_min < FINAL_FORMAT_P or abs(mean_p - target_p) > CHOICE_TOL:
        raise SystemExit(f"codex base: softening missed (p {mean_p:.3f}, format {fmt_min:.6f})")
    tiny.save(model, tok_dir, out, st)
    info = {"mean_p_correct": mean_p, "format_min_p": fmt_min, "alpha": alpha, "split_token": split,
            "direction_tokens": dir_tok, "p_any_direction_min": float(p_dirs.min()), "seed": seed,
            "prompt_tokens": [min(len(s) for s in seqs), max(len(s) for s in seqs)],
            "seconds": round(time.time() - t0, 1)}
    (out / "grpo_base.json").write_text(json.dumps(info, indent=2))
    (out / "codex_request.json").write_text(json.dumps(codex_task.prompt_key(body), indent=1))
    log(f"codex base model -> {out} {info}")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--target-p", type=float, default=0.3)
    args = ap.parse_args(argv)
    import torch
    torch.set_num_threads(1)
    build(Path(args.out), args.seed, args.target_p,
          log=lambda m: print(f"[grpo codex base] {m}", file=sys.stderr, flush=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
