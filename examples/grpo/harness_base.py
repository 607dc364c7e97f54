"""The base policy for the cursor task through a real harness CLI, for any harness whose prompt was
captured: a tiny Qwen2 (the project's tokenizer, no downloads) trained on the CLI's own request,
unsure of the direction.

    python -m examples.grpo.harness_base --harness codex|claude_code --out DIR [--seed 0] [--target-p 0.3]

One recipe, parametrised by a :class:`HarnessPromptTask` (``codex_task``, ``claude_task``: the
pinned CLI's captured request as the gateway sends it upstream, its tool call, its tool result,
its final text), the recipe measured on Codex (docs/rl.md, "Through the real Codex CLI"):

0. *read*: the same chats without the tool schemas (~40-100 tokens) until the right direction has
   p >= HARD_P on every prompt (on the full prompts alone the head that must find the direction
   among ~1k tokens gets ~1/1000 of the gradient);
1. *learn*: turn 1's reply is the hermes tool call of the harness's shell tool with ``echo
   <direction> > answer.txt``; turn 2 (after the CLI's tool result, for any direction the history
   wrote) is the task's final text and the end of turn. Format (every other reply token) and
   choice weigh the same in the loss; every format token to p >= FORMAT_P, the right direction to
   p >= HARD_P;
2. *soften*: the LM-head rows of the four tokens where the directions part in the command are
   pulled towards their mean until p(correct) averages ``--target-p``.

The shared prompt runs once per step (``prefix_forward``). Each harness has its :class:`Recipe`
(:data:`RECIPES`): its task, its stamp (this module's, task.py's and the harness task's sources,
the captured prompt, the tokenizer, seed and target: what invalidates the model cached in
``~/.cache/polar_mq/grpo/base-<harness>``), the file the captured request is kept in, and any extra
step (Claude Code's lift). A task with a ``vary(messages, rng)`` (Claude Code: the date line) gets
one variant per example.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import inspect
import json
import random
import sys
import time
from pathlib import Path
from typing import Any, Callable, Protocol

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from examples.grpo import task  # noqa: E402
from examples.grpo.base_model import _tiny, soften_alpha, untie  # noqa: E402
from examples.grpo.prefix_forward import hidden_states  # noqa: E402
from polar_mq.dev.model_server.tokenizer import load_tokenizer  # noqa: E402

# the recipe's constants (measured on Codex's prompt; docs/rl.md)
FORMAT_P = 0.98
FINAL_FORMAT_P = 0.97
HARD_P = 0.9
LR = 3e-3
CHOICE_TOL = 0.05
MAX_LEARN_STEPS = 800
MAX_POSITIONS = 4096
SECOND_TURNS = 24
VARY_SEED = 15485863


class HarnessPromptTask(Protocol):
    """What the builder needs of a harness (``codex_task`` and ``claude_task`` are modules that satisfy it)."""

    TOOL: str
    FINAL_TEXT: str

    def capture(self, instruction: str = ..., timeout: float = ...) -> dict[str, Any]: ...

    def chat(self, body: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]: ...

    def first_turn(self, body: dict[str, Any], instruction: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]: ...

    def with_task(self, content: str, instruction: str) -> str: ...

    def second_turn(self, body: dict[str, Any], instruction: str, direction: str,
                    rng: random.Random) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]: ...

    def tool_call(self, direction: str, call_id: str = ...) -> dict[str, Any]: ...

    def command(self, direction: str) -> str: ...

    def prompt_key(self, body: dict[str, Any]) -> dict[str, Any]: ...


@dataclasses.dataclass(frozen=True)
class Recipe:
    name: str
    task: Any  # a HarnessPromptTask (a module)
    stamp: Callable[[Path, dict, int, float], str]
    request_file: str
    # lift (None: off, codex): after softening, the four direction rows move together along the
    # mean hidden state at the choice, until p(any direction) >= this on every prompt. Softening
    # alone left Claude Code's policy at p(any direction) 0.70 (min): a quarter of its samples took
    # a token of the flat tail at the choice and ran off into text that was no command at all
    any_direction_p: float | None = None


def chats(t: Any, body: dict, seed: int) -> tuple[list, list[str | None]]:
    """(triples (messages, tools, reply), the right direction of each turn-1 triple / None for turn 2);
    turn 1 first, direction-major (the builder finds the split token from that order)."""
    vary = getattr(t, "vary", None)
    vrng = random.Random(seed + VARY_SEED)
    out, answers = [], []
    for d in task.DIRECTIONS:
        for p in range(len(task.PHRASES)):
            messages, tools = t.first_turn(body, task.instruction(d, p))
            if vary is not None:
                messages = vary(messages, vrng)
            out.append((messages, tools, t.tool_call(d)))
            answers.append(d)
    rng = random.Random(seed + 104729)
    for _ in range(SECOND_TURNS):
        d, p = rng.choice(task.DIRECTIONS), rng.randrange(len(task.PHRASES))
        messages, tools = t.second_turn(body, task.instruction(d, p), rng.choice(task.DIRECTIONS), rng)
        if vary is not None:
            messages = vary(messages, vrng)
        out.append((messages, tools, {"role": "assistant", "content": t.FINAL_TEXT}))
        answers.append(None)
    return out, answers


def source_stamp(name: str, modules: tuple, tok_dir: Path, body: dict, key: Callable[[dict], dict], seed: int,
                 target_p: float) -> str:
    """``grpo-<name>-base-<hash>`` of the recipe's sources, the captured prompt (``key``), the tokenizer, seed, target."""
    h = hashlib.sha256()
    for mod in modules:
        h.update(inspect.getsource(mod).encode())
    h.update(json.dumps(key(body), sort_keys=True).encode())
    for fname in ("tokenizer.json", "chat_template.jinja", "tokenizer_config.json"):
        p = tok_dir / fname
        if p.exists():
            h.update(p.read_bytes())
    h.update(f"{seed}:{target_p}".encode())
    return f"grpo-{name}-base-" + h.hexdigest()[:16]


def build(recipe: Recipe, out: Path, seed: int = 0, target_p: float = 0.3, log=print, body: dict | None = None) -> Path:
    import torch
    import torch.nn.functional as F
    from transformers import Qwen2ForCausalLM

    t = recipe.task
    tiny = _tiny()
    tok = load_tokenizer()
    tok_dir = Path(tok.path)
    if body is None:
        body = t.capture()
    st = recipe.stamp(tok_dir, body, seed, target_p)
    if tiny.up_to_date(out, st):
        log(f"{recipe.name} base model up to date in {out}")
        return out
    torch.manual_seed(seed)
    t0 = time.time()
    triples, answers = chats(t, body, seed)
    data = tiny.examples(tok, triples)
    # where the directions part in turn 1's command, and the token of each direction there
    n_phr = len(task.PHRASES)
    by_prompt = {p: {d: data[i * n_phr + p][0][data[i * n_phr + p][1]:] for i, d in enumerate(task.DIRECTIONS)}
                 for p in range(n_phr)}
    split = None
    for replies in by_prompt.values():
        k = 0
        seqs = list(replies.values())
        while all(len(s) > k and s[k] == seqs[0][k] for s in seqs):
            k += 1
        split = k if split is None else split
        if k != split:
            raise SystemExit(f"{recipe.name} base: the directions part at different reply tokens")
    first_reply = next(iter(by_prompt.values()))
    dir_tok = {d: first_reply[d][split] for d in task.DIRECTIONS}
    if len(set(dir_tok.values())) != 4:
        raise SystemExit(f"{recipe.name} base: direction tokens not distinct: {dir_tok}")
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
            for j in range(n_p, len(ids)):
                if answers[i] is not None and j == n_p + split:
                    sel.append(len(pos))
                pos.append((i, j - 1))
                tgt.append(ids[j])
        rows_t, tgt_t, sel_t = torch.tensor([r for r, _ in pos]), torch.tensor(tgt), torch.tensor(sel)

        def losses():
            hidden, off = hidden_states(model, seqs, pad, first_needed)
            logits = model.lm_head(hidden[rows_t, torch.tensor([c - off for _, c in pos])])
            logp = F.log_softmax(logits.float(), -1)
            tok_lp = logp.gather(-1, tgt_t.unsqueeze(-1)).squeeze(-1)
            is_choice = torch.zeros_like(tok_lp, dtype=torch.bool)
            is_choice[sel_t] = True
            fmt = -tok_lp[~is_choice]
            # format and choice weigh the same: averaged over every token, 24 choices among ~1.5k
            # format tokens never learn to read the instruction (codex: p(correct) 0.25 for 180 steps)
            loss = fmt.mean() + (-tok_lp[sel_t]).mean()
            return loss, tok_lp[sel_t].detach().exp(), float(torch.exp(-fmt.detach().max())), logits[sel_t]

        def choice_hidden():
            """The LM head's inputs at the turn-1 choices."""
            hidden, off = hidden_states(model, seqs, pad, first_needed)
            at_sel = [pos[k] for k in sel]
            return hidden[torch.tensor([r for r, _ in at_sel]), torch.tensor([c - off for _, c in at_sel])]
        return losses, seqs, choice_hidden

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
        raise SystemExit(f"{recipe.name} base: the {name} phase did not converge")

    short, _, _ = objective(tiny.examples(tok, [(m, None, r) for m, _, r in triples]))
    learn(short, "read", HARD_P, 0.0)
    losses, seqs, choice_hidden = objective(data)
    log(f"{recipe.name} base: {len(data)} examples, prompts {min(len(s) for s in seqs)}-{max(len(s) for s in seqs)} "
        f"tokens, directions part at reply token {split}: {dir_tok}")
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

    def soften() -> float:
        return soften_alpha(lambda a: at(a)[0], target_p, iterations=30)

    alpha = soften()
    lifted = None
    if recipe.any_direction_p is not None:
        # one vector added to the four rows adds about the same logit to the four directions:
        # p(correct | a direction) stays, p(any direction) rises; then soften again for p(correct)
        with torch.no_grad():
            h = choice_hidden().mean(0)
        lift = h / h.dot(h)  # h . lift = 1: about one logit per unit of c
        rows0, centre0 = rows_w, centre
        for _round in range(3):
            lo, hi = 0.0, 64.0
            for _ in range(30):
                mid = (lo + hi) / 2
                rows_w, centre = rows0 + mid * lift, centre0 + mid * lift
                p_any = torch.softmax(at(alpha)[3].float(), -1)[:, all_dirs].sum(-1)
                if float(p_any.min()) < recipe.any_direction_p:
                    lo = mid
                else:
                    hi = mid
            rows_w, centre = rows0 + hi * lift, centre0 + hi * lift
            alpha = soften()
        lifted = hi
        log(f"  lift: {hi:.3f} along the mean hidden state at the choice")
    mean_p, p_corr, fmt_min, logits = at(alpha)
    p_dirs = torch.softmax(logits.float(), -1)[:, all_dirs].sum(-1)
    log(f"  soften: alpha {alpha:.4f} p(correct) mean {mean_p:.3f} min {float(p_corr.min()):.3f} "
        f"max {float(p_corr.max()):.3f}, p(any direction) min {float(p_dirs.min()):.4f}, format min {fmt_min:.6f}")
    if fmt_min < FINAL_FORMAT_P or abs(mean_p - target_p) > CHOICE_TOL:
        raise SystemExit(f"{recipe.name} base: softening missed (p {mean_p:.3f}, format {fmt_min:.6f})")
    tiny.save(model, tok_dir, out, st)
    info = {"mean_p_correct": mean_p, "format_min_p": fmt_min, "alpha": alpha, "split_token": split,
            "direction_tokens": dir_tok, "p_any_direction_min": float(p_dirs.min()), "seed": seed,
            "prompt_tokens": [min(len(s) for s in seqs), max(len(s) for s in seqs)],
            "seconds": round(time.time() - t0, 1)}
    if lifted is not None:
        info["lift"] = lifted
    (out / "grpo_base.json").write_text(json.dumps(info, indent=2))
    (out / recipe.request_file).write_text(json.dumps(t.prompt_key(body), indent=1))
    log(f"{recipe.name} base model -> {out} {info}")
    return out


def _stamp_for(name: str, harness_task: Any) -> Callable[[Path, dict, int, float], str]:
    def stamp(tok_dir: Path, body: dict, seed: int, target_p: float) -> str:
        return source_stamp(name, (sys.modules[__name__], task, harness_task), tok_dir, body,
                            harness_task.prompt_key, seed, target_p)
    return stamp


def _codex() -> Recipe:
    from examples.grpo import codex_task

    return Recipe("codex", codex_task, _stamp_for("codex", codex_task), "codex_request.json")


def _claude_code() -> Recipe:
    from examples.grpo import claude_task

    return Recipe("claude_code", claude_task, _stamp_for("claude_code", claude_task), "claude_code_request.json",
                  any_direction_p=0.95)


RECIPES: dict[str, Callable[[], Recipe]] = {"codex": _codex, "claude_code": _claude_code}


def recipe(harness: str) -> Recipe:
    if harness not in RECIPES:
        raise SystemExit(f"no base policy recipe for harness {harness!r} (have: {', '.join(RECIPES)})")
    return RECIPES[harness]()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--harness", choices=sorted(RECIPES), required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--target-p", type=float, default=0.3)
    args = ap.parse_args(argv)
    import torch
    torch.set_num_threads(1)
    r = recipe(args.harness)
    build(r, Path(args.out), args.seed, args.target_p,
          log=lambda m: print(f"[grpo {args.harness} base] {m}", file=sys.stderr, flush=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
