"""Offline proxy of the GRPO loop through a CLI (``--harness codex|claude_code``), for comparing
trainer settings on many seeds in minutes instead of one real run per 4-7 minutes: the base policy
samples turn 1 of the CLI's session (the hermes tool call) at temperature 1 in torch, on the CLI's
captured prompt (the base's ``<harness>_request.json``); the reward is the grader's rule (a
well-formed call of the CLI's tool whose command writes the instruction's direction to
answer.txt); ``PolicyTrainer`` trains with the harness's defaults (``run.CLI_TRAINERS``: the LM
head, plain SGD, clip 0.2, lr by groups; Claude Code's ``head_rows`` sampled).

    python -m examples.grpo.cli_sim [--harness codex|claude_code] [--base DIR] [--seeds 4] [--steps 6] \
        [--optimizer sgd|adamw] [--lr ..] [--prompts 4] ...

Per step it prints the mean reward and the fraction of well-formed tool calls (the format: a
collapse is that fraction falling towards 0). Not the real loop: no CLI, no vLLM, no turn 2
(``Done.``) in the trained tokens; its choice of settings is confirmed by the real runs.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from examples.grpo import harness_base, task  # noqa: E402
from examples.grpo.base_model import _tiny  # noqa: E402
from examples.grpo.run import CLI_TRAINERS  # noqa: E402
from examples.grpo.trainer import PolicyTrainer  # noqa: E402
from polar_mq.dev.model_server.tokenizer import load_tokenizer  # noqa: E402
from polar_mq.rl.advantages import group_advantages  # noqa: E402
from polar_mq.rl.trainers.samples import TrainSample  # noqa: E402

CALL = re.compile(r"^<tool_call>\s*(\{.*\})\s*</tool_call>\s*$", re.S)
CMD = re.compile(r"^\s*echo\s+(\S+)\s*>\s*answer\.txt\s*$")


def verdict(t, text: str, direction: str) -> tuple[bool, float]:
    """(well-formed tool call, reward) of a turn-1 reply, for the harness task ``t``: a call of
    ``t.TOOL`` with the one argument ``t.tool_call`` has (codex ``cmd``, Claude Code ``command``)."""
    m = CALL.match(text)
    if not m:
        return False, 0.0
    (arg,) = json.loads(t.tool_call(direction)["tool_calls"][0]["function"]["arguments"])
    try:
        call = json.loads(m.group(1))
        args = call["arguments"]
        args = json.loads(args) if isinstance(args, str) else args
        cmd = args[arg]
    except (ValueError, KeyError, TypeError):
        return False, 0.0
    if call.get("name") != t.TOOL or not isinstance(cmd, str):
        return False, 0.0
    c = CMD.match(cmd)
    return True, 1.0 if c and c.group(1) == direction else 0.0


def prompts(recipe: harness_base.Recipe, base: Path, tok, seed: int) -> list[tuple[list[int], str]]:
    """(prompt ids, right direction) of every (direction, phrase) instruction on the CLI's captured
    prompt, varied as the base policy was trained (Claude Code: a random date)."""
    key = json.loads((base / recipe.request_file).read_text())
    t, tiny, rng = recipe.task, _tiny(), random.Random(seed)
    vary = getattr(t, "vary", None)
    out = []
    for d in task.DIRECTIONS:
        for p in range(len(task.PHRASES)):
            messages = [dict(m) for m in key["messages"]]
            user = [i for i, m in enumerate(messages) if m["role"] == "user"]
            messages[user[0]]["content"] = t.with_task(messages[user[0]]["content"], task.instruction(d, p))
            if vary is not None:
                messages = vary(messages, rng)
            ids, n_p = tiny.examples(tok, [(messages, key["tools"], t.tool_call(d))])[0]
            out.append((ids[:n_p], d))
    return out


def simulate(args: argparse.Namespace, seed: int, log=print) -> list[tuple[float, float]]:
    """One offline run; (mean reward, well-formed fraction) of every step."""
    import torch

    torch.manual_seed(seed)
    rng = random.Random(seed)
    tok = load_tokenizer()
    recipe = harness_base.recipe(args.harness)
    rows = prompts(recipe, Path(args.base), tok, seed)
    eos = tok.eos_token_id
    tr = PolicyTrainer(Path(args.base), lr=args.lr, clip_eps=args.clip, minibatches=1, epochs=args.epochs,
                       seed=seed, optimizer=args.optimizer, trainable="lm_head", adam_eps=args.adam_eps,
                       head_rows=args.head_rows)
    m = tr.model
    by_dir = {d: [i for i, (_, a) in enumerate(rows) if a == d] for d in task.DIRECTIONS}
    out = []
    for step in range(args.steps):
        t0 = time.time()
        dirs = list(by_dir)
        rng.shuffle(dirs)
        picks = [rng.choice(by_dir[dirs[k % len(dirs)]]) for k in range(args.prompts)]
        samples, rewards, formed = [], [], []
        for gi in picks:
            p_ids, d = rows[gi]
            with torch.no_grad():
                g = m.generate(torch.tensor([p_ids] * args.group_size), do_sample=True, temperature=1.0, top_k=0,
                               top_p=1.0, max_new_tokens=args.max_tokens, eos_token_id=eos, pad_token_id=eos,
                               output_scores=True, return_dict_in_generate=True)
            seqs = g.sequences[:, len(p_ids):]
            lps = torch.stack([torch.log_softmax(s.float(), -1) for s in g.scores], 1)
            group = []
            for j in range(args.group_size):
                resp = []
                for t in seqs[j].tolist():
                    resp.append(t)
                    if t == eos:
                        break
                lp = [float(lps[j, k, t]) for k, t in enumerate(resp)]
                ok, r = verdict(recipe.task, tok.decode(resp[:-1] if resp[-1] == eos else resp), d)
                group.append((resp, lp, r))
                formed.append(ok)
            rs = [x[2] for x in group]
            rewards += rs
            if max(rs) == min(rs):
                continue
            for (resp, lp, r), a in zip(group, group_advantages(rs, "mean_std")):
                samples.append(TrainSample(p_ids, resp, [1] * len(resp), lp, r, a or 0.0, str(gi), "s"))
        used = len({s.group_id for s in samples})
        st = tr.step(samples, lr_scale=used / args.prompts)
        out.append((sum(rewards) / len(rewards), sum(formed) / len(formed)))
        log(f"seed {seed} step {step} reward {out[-1][0]:.3f} well-formed {out[-1][1]:.3f} groups {used} "
            f"ratio max {st.ratio_max:.2f} clip {st.clip_fraction:.2f} {time.time() - t0:.1f}s")
    return out


def main(argv: list[str] | None = None) -> int:
    import os

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    cache = Path(os.environ.get("POLAR_CACHE_DIR") or Path.home() / ".cache" / "polar_mq")
    ap.add_argument("--harness", choices=sorted(CLI_TRAINERS), default="codex")
    ap.add_argument("--base", default=None, help="default: the cached base policy run.py builds for the harness")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--lr", type=float, default=None)
    ap.add_argument("--epochs", type=int, default=None)
    ap.add_argument("--clip", type=float, default=0.2)
    ap.add_argument("--optimizer", choices=["adamw", "sgd"], default=None)
    ap.add_argument("--head-rows", choices=["all", "sampled"], default=None)
    ap.add_argument("--adam-eps", type=float, default=1e-8)
    ap.add_argument("--max-tokens", type=int, default=48)
    args = ap.parse_args(argv)
    defaults = CLI_TRAINERS[args.harness]  # the harness's trainer in run.py, unless overridden
    args.base = args.base or str(cache / "grpo" / f"base-{args.harness}")
    for name in ("lr", "epochs", "optimizer", "head_rows"):
        if getattr(args, name) is None:
            setattr(args, name, defaults.get(name, "all"))
    import torch
    torch.set_num_threads(1)
    from examples.grpo.report import learnt

    passed = 0
    for seed in range(args.seed, args.seed + args.seeds):
        res = simulate(args, seed, log=lambda s: print(s, flush=True))
        v = learnt([r for r, _ in res], args.prompts * args.group_size)
        passed += v["passed"]
        print(f"seed {seed}: reward {' '.join(f'{r:.2f}' for r, _ in res)} | well-formed "
              f"{' '.join(f'{f:.2f}' for _, f in res)} | learnt {v['passed']}", flush=True)
    print(f"{args.harness}: {args.optimizer} lr {args.lr} x {args.epochs} epochs: learnt in {passed} of {args.seeds} seeds", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
