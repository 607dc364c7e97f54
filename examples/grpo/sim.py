"""Offline proxy of the GRPO loop, for tuning the trainer in seconds instead of minutes: the reply
(direction word + end of turn) is sampled at temperature 1 from the trainer's own model in
torch, rewarded by the same rule as the grader (the right direction, then the end of turn), and
trained by the same ``PolicyTrainer`` step the real loop uses.

    python -m examples.grpo.sim --base DIR [--steps 10] [--prompts 4] [--group-size 8] [--lr ..]

Not the real loop (no vLLM, no polar_mq, no sampling-implementation gap): a tool for choosing
settings, whose choice the real run (``examples.grpo.run``) then confirms.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from examples.grpo import base_model as bm  # noqa: E402
from examples.grpo.trainer import PolicyTrainer  # noqa: E402
from polar_mq.rl.advantages import group_advantages  # noqa: E402
from polar_mq.rl.trainers.samples import TrainSample  # noqa: E402


def simulate(args: argparse.Namespace, seed: int, log=print) -> list[float]:
    """One offline run; the mean sampled reward of every step."""
    import torch

    torch.manual_seed(seed)
    rng = random.Random(seed)
    tiny, tok = bm._tiny(), bm.load_tokenizer()
    dir_ids = bm.direction_ids(tok)
    first, answers = bm.chats()
    prompts = [ids[:n_p] for ids, n_p in tiny.examples(tok, first)]
    eos = tok.eos_token_id
    tr = PolicyTrainer(Path(args.base), lr=args.lr, clip_eps=args.clip, minibatches=args.minibatches,
                       epochs=args.epochs, seed=seed, optimizer=args.optimizer, trainable=args.trainable,
                       head_rows=args.head_rows)
    m = tr.model

    def next_logp(seqs: list[list[int]]):
        with torch.no_grad():
            return torch.stack([torch.log_softmax(m(input_ids=torch.tensor([s])).logits[0, -1].float(), -1)
                                for s in seqs])

    def evaluate() -> tuple[float, float]:
        lp = next_logp(prompts)
        pc = [float(lp[i, dir_ids[a]].exp()) for i, a in enumerate(answers)]
        ends = next_logp([p + [dir_ids[a]] for p, a in zip(prompts, answers)])[:, eos].exp()
        return sum(pc) / len(pc), float(ends.min())

    pc, end_min = evaluate()
    log(f"step -1 eval p(correct) {pc:.3f} p(end) min {end_min:.5f}")
    step_rewards: list[float] = []
    for step in range(args.steps):
        t0 = time.time()
        # as task.rows: every step's prompts cover the directions evenly
        by_dir = {d: [i for i, a in enumerate(answers) if a == d] for d in dict.fromkeys(answers)}
        dirs = list(by_dir)
        rng.shuffle(dirs)
        picks = [rng.choice(by_dir[dirs[k % len(dirs)]]) for k in range(args.prompts)]
        samples, rewards_all = [], []
        for gi in picks:
            lp1 = next_logp([prompts[gi]])[0]
            group = []
            for _ in range(args.group_size):
                d = int(torch.multinomial(lp1.exp(), 1))
                lp2 = next_logp([prompts[gi] + [d]])[0]
                e = int(torch.multinomial(lp2.exp(), 1))
                r = 1.0 if d == dir_ids[answers[gi]] and e == eos else 0.0
                group.append(([d, e], [float(lp1[d]), float(lp2[e])], r))
            rewards = [g[2] for g in group]
            rewards_all += rewards
            if max(rewards) == min(rewards):
                continue
            for (resp, lps, r), a in zip(group, group_advantages(rewards, args.advantage)):
                samples.append(TrainSample(prompts[gi], resp, [1, 1], lps, r, a or 0.0, str(gi), "s"))
        used = len({s.group_id for s in samples})
        st = tr.step(samples, lr_scale=used / args.prompts if args.lr_by_groups else 1.0)
        pc, end_min = evaluate()
        step_rewards.append(sum(rewards_all) / len(rewards_all))
        log(f"step {step} reward {step_rewards[-1]:.3f} eval p(correct) {pc:.3f} "
            f"p(end) min {end_min:.5f} samples {len(samples)} clip {st.clip_fraction:.2f} {time.time() - t0:.1f}s")
    return step_rewards


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", required=True)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--seeds", type=int, default=0,
                    help="run seeds SEED .. SEED+N-1 and report how often the CI test's criterion holds "
                         "(report.trend_beyond_noise: the reward's slope over the steps beyond 2 binomial "
                         "SE) and the older first-vs-last one (report.rise_beyond_noise)")
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--optimizer", default="adamw")
    ap.add_argument("--trainable", choices=["all", "lm_head"], default="all")
    ap.add_argument("--head-rows", choices=["all", "sampled"], default="all")
    ap.add_argument("--advantage", choices=["mean_std", "leave_one_out"], default="mean_std")
    ap.add_argument("--minibatches", type=int, default=1)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--clip", type=float, default=0.2)
    ap.add_argument("--lr-by-groups", action="store_true",
                    help="scale each step's lr by the fraction of groups whose rewards differ (run.py's option)")
    args = ap.parse_args(argv)
    if not args.seeds:
        simulate(args, args.seed, log=lambda m: print(m, flush=True))
        return 0
    from examples.grpo.report import learnt, rise_beyond_noise, trend_beyond_noise

    n = args.prompts * args.group_size
    held = {"trend": 0, "first-vs-last": 0, "ci (trend or gain, z 2.3)": 0}
    for seed in range(args.seed, args.seed + args.seeds):
        rewards = simulate(args, seed, log=lambda m: None)
        rise, trend = rise_beyond_noise(rewards, n), trend_beyond_noise(rewards, n)
        held["trend"] += trend["passed"]
        held["first-vs-last"] += rise["passed"]
        held["ci (trend or gain, z 2.3)"] += learnt(rewards, n)["passed"]
        print(f"seed {seed}: {' '.join(f'{r:.2f}' for r in rewards)} | trend: slope {trend['slope']:+.3f}/step "
              f"z {trend['z']:.1f} fitted rise {trend['fitted_rise']:+.2f} {'pass' if trend['passed'] else 'FAIL'} | "
              f"first-vs-last: {rise['first']:.2f} -> {rise['last']:.2f} (noise {rise['noise']:.2f}) "
              f"{'pass' if rise['passed'] else 'FAIL'}", flush=True)
    print(f"held in {args.seeds} seeds: trend {held['trend']}, first-vs-last {held['first-vs-last']}, "
          f"CI criterion {held['ci (trend or gain, z 2.3)']} "
          f"({args.steps} steps x {args.prompts} prompts x {args.group_size} samples, lr {args.lr}, "
          f"epochs {args.epochs}, clip {args.clip})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
