"""The codex trainer (examples/grpo/run.py's ``CODEX_TRAINER``: the LM head, plain SGD) moves the
LM head in proportion to the gradient; AdamW, the old default, does not (docs/rl.md, "Through the
real Codex CLI": the tool-call format collapse).

One GRPO group of eight replies ``F <choice> G`` on one prompt, reward 1 for the right choice, on a
tiny Qwen2 whose head knows the format (F, G at p > 0.997) but not the choice. Every sample of a
codex group carries the same tool-call tokens and the advantages sum to zero, so those rows'
gradients nearly cancel; AdamW normalises each parameter's residual to a full lr-sized step (8
epochs: nats of logit at every position, and Codex's tool-call JSON broke in ~1 run of 4)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from examples.grpo.trainer import PolicyTrainer  # noqa: E402
from polar_mq.rl.advantages import group_advantages  # noqa: E402
from polar_mq.rl.trainers.samples import TrainSample  # noqa: E402

VOCAB = 96
F, G = 10, 11
CHOICES = [20, 21, 22, 23]
RIGHT = 20
FORMAT_P = 0.997  # the codex base's tool-call tokens: p ~0.98-0.998 (most 0.997)
PROMPT = [1, 2, 3, 4, 5]


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A tiny Qwen2 as wide as the codex base (64), its LM head untied, whose head is taught the
    format (F and G at p > FORMAT_P, as the codex base's tool-call tokens) but not the choice."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
                      tie_word_embeddings=False, pad_token_id=0)
    model = Qwen2ForCausalLM(cfg)
    ids = torch.tensor([PROMPT + [F, c, G] for c in CHOICES])
    with torch.no_grad():  # the body stays random: only the head learns, on fixed hidden states
        h = model.model(input_ids=ids).last_hidden_state[:, len(PROMPT) - 1:-1]
    opt = torch.optim.Adam(model.lm_head.parameters(), lr=1e-2)
    for _ in range(1000):
        logp = torch.log_softmax(model.lm_head(h).float(), -1)
        fmt = torch.stack([logp[:, 0, F], logp[:, 2, G]], 1)
        if float(fmt.min().exp()) > FORMAT_P:
            break
        opt.zero_grad()
        (-fmt.mean()).backward()
        opt.step()
    assert float(fmt.min().exp()) > FORMAT_P
    out = tmp_path_factory.mktemp("tiny") / "m"
    model.save_pretrained(out, safe_serialization=True)
    return out


def logprobs(trainer: PolicyTrainer):
    """[4 replies, 3 positions, vocab] log-probabilities of the group's distinct replies."""
    with torch.no_grad():
        logits = trainer.model(input_ids=torch.tensor([PROMPT + [F, c, G] for c in CHOICES])).logits.float()
    return torch.log_softmax(logits[:, len(PROMPT) - 1:-1], -1)


def step(trainer: PolicyTrainer, scale: float = 1.0):
    """One step on the group (advantages times ``scale``): (log-probabilities before, after)."""
    replies = [[F, c, G] for c in CHOICES * 2]
    rewards = [1.0 if r[1] == RIGHT else 0.0 for r in replies]
    lp = logprobs(trainer)
    batch = [TrainSample(PROMPT, r, [1] * len(r), [float(lp[i % 4, k, t]) for k, t in enumerate(r)], rw, a * scale,
                         "g", f"s{i}")
             for i, (r, rw, a) in enumerate(zip(replies, rewards, group_advantages(rewards, "mean_std")))]
    trainer.step(batch)
    return lp, logprobs(trainer)


def test_codex_trainer_learns_the_choice_and_keeps_the_format(base):
    from examples.grpo.run import CODEX_TRAINER

    assert CODEX_TRAINER["trainable"] == "lm_head" and CODEX_TRAINER["optimizer"] == "sgd"
    before, after = step(PolicyTrainer(base, **CODEX_TRAINER))
    right = CHOICES.index(RIGHT)
    assert float(after[right, 1, RIGHT].exp()) > float(before[right, 1, RIGHT].exp()) + 0.1
    assert float(after[:, 0, F].exp().min()) > FORMAT_P and float(after[:, 2, G].exp().min()) > 0.99


def moved(base, scale: float, **trainer) -> float:
    before, after = step(PolicyTrainer(base, **trainer), scale=scale)
    return float((after - before).abs().max())


def test_codex_trainer_steps_in_proportion_to_the_gradient(base):
    """Advantages of +-1e-3 and of +-1e-4 (gradients that nearly cancel, as the tool-call tokens'
    do in every codex group): under the codex trainer the second moves the logits ~10x less than
    the first; AdamW (the old default, 1e-2 x 8 epochs) normalises the scale away and moves them
    as far for either (what turned the tool-call rows' residuals into full steps)."""
    from examples.grpo.run import CODEX_TRAINER

    ratio = moved(base, 1e-3, **CODEX_TRAINER) / moved(base, 1e-4, **CODEX_TRAINER)
    assert ratio > 5, ratio
    adamw = {"trainable": "lm_head", "optimizer": "adamw", "lr": 1e-2, "epochs": 8}
    ratio = moved(base, 1e-3, **adamw) / moved(base, 1e-4, **adamw)
    assert ratio < 2, ratio
