"""TRL's GRPOTrainer sampling through polar_mq: real TRL steps on a tiny Qwen2 (the project's
tokenizer, random init) whose completions come from real harness sessions (the shell harness
running the openai-SDK tiny agent through the gateway), via PolarRollout and the groups API."""

from __future__ import annotations

import os

import pytest

pytest.importorskip("trl")
torch = pytest.importorskip("torch")
import importlib  # noqa: E402

# pytest puts tests/ on sys.path, where tests/vllm (the real-vLLM suite) looks like a package
# named vllm without a version; TRL's optional-vLLM probe would then fail to parse 'N/A'. vLLM
# is not used here (polar_mq samples), so tell TRL it is absent.
importlib.import_module("trl.import_utils").is_vllm_available = lambda *args, **kwargs: False

from tests.support.pipeline import agent_task  # noqa: E402
from polar_mq.rl.trainers.trl import PolarRollout
from polar_mq.rl.trainers.trl import polar_reward
from polar_mq.rl.trainers.trl import sync_callback  # noqa: E402
from tests.support.trainer import drain, rollout_stack  # noqa: E402,F401  (fixture)


def tiny_model_and_tokenizer():
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    from polar_mq.dev.model_server.tokenizer import load_tokenizer

    tok = load_tokenizer()
    hf_tok = PreTrainedTokenizerFast.from_pretrained(str(tok.path))
    hf_tok.pad_token = "<|endoftext|>"
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=((tok.vocab_size + 63) // 64) * 64, hidden_size=32, intermediate_size=64,
                      num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2, head_dim=16,
                      max_position_embeddings=4096, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.special_ids["<|endoftext|>"], tie_word_embeddings=False)
    return Qwen2ForCausalLM(cfg), hf_tok


def test_grpo_trainer_steps_on_polar_rollouts(rollout_stack, tmp_path):  # noqa: F811
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    os.environ["TRL_EXPERIMENTAL_SILENCE"] = "1"
    _, client = rollout_stack
    drain(client)
    model, tok = tiny_model_and_tokenizer()
    template = {k: v for k, v in agent_task().items() if k not in ("instruction", "num_samples")}
    rollout = PolarRollout(client, template, timeout=240, eos_token_id=tok.eos_token_id)
    synced: list[int] = []
    seen: list[dict] = []

    def spy(prompts, trainer):
        out = rollout(prompts, trainer)
        seen.append(out)
        return out

    def spread(completions, polar_session_id=None, **_):
        """Test-only second reward term: the stand-in answers every sample alike, so without it
        every advantage is 0 and the optimiser would have nothing to move."""
        return [0.1 * (i % 2) for i in range(len(completions))]

    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    args = GRPOConfig(output_dir=str(tmp_path / "out"), num_generations=2, per_device_train_batch_size=2,
                      gradient_accumulation_steps=1, max_steps=2, learning_rate=1e-2, use_cpu=True,
                      report_to=[], logging_steps=1, save_strategy="no", max_completion_length=256,
                      bf16=False, seed=0, dataloader_num_workers=0)
    trainer = GRPOTrainer(model=model, processing_class=tok, reward_funcs=[polar_reward, spread], args=args,
                          train_dataset=Dataset.from_list([{"prompt": "Write hello into polar.txt"}] * 4),
                          rollout_func=spy, callbacks=[sync_callback(lambda m, step: synced.append(step))])
    trainer.train()

    # two real TRL optimiser steps, each on a batch sampled through polar_mq sessions
    assert trainer.state.global_step == 2 and synced == [1, 2]
    assert len(seen) == 2 and len(rollout.last_groups) == 1
    group = rollout.last_groups[0]
    assert group["metadata"]["policy_version"] == 1  # the weights after step 1 sampled batch 2
    trajs = sorted(group["trajectories"], key=lambda t: t["session_id"])
    out = seen[-1]
    # what TRL trained on is exactly what the gateway recorded: ids, logprobs, loss mask
    for i, traj in enumerate(trajs):
        tr = traj["traces"][0]
        assert out["prompt_ids"][i] == tr["prompt_ids"] and out["completion_ids"][i] == tr["response_ids"]
        assert out["logprobs"][i] == tr["response_logprobs"] and out["env_mask"][i] == tr["loss_mask"]
        assert out["polar_reward"][i] == traj["reward"]
    assert any(0 in m for m in out["env_mask"])  # the tool result between the two turns is masked
    changed = sum(int(not torch.equal(before[n], p.detach())) for n, p in model.named_parameters())
    assert changed > 0  # the optimiser moved the weights
    logged = [h for h in trainer.state.log_history if "rewards/polar_reward/mean" in h]
    assert len(logged) == 2 and all(h["rewards/polar_reward/mean"] == pytest.approx(1.0) for h in logged)
