"""The Codex path of the GRPO example without a model: the pinned Codex CLI's prompt under the
example's configuration, the reply shapes, the answer check, and the shared-prefix forward.

``codex_task.capture`` runs the real, unmodified Codex binary against a local recorder: the
overrides must all be accepted (none ignored), and what the model sees must be the short
instructions, the user's task and Codex's own shell tools only (examples/grpo/codex_task.py).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from examples.grpo import codex_task  # noqa: E402
from polar_mq.harnesses import install  # noqa: E402

needs_node = pytest.mark.skipif(not install.npm_available(), reason="node/npm not on PATH: Codex CLI cannot run")


@pytest.fixture(scope="module")
def codex_body():
    try:
        install.install(["codex"], timeout=600)
    except install.InstallError as exc:  # e.g. the npm registry is unreachable
        pytest.skip(f"could not install codex from npm: {exc}")
    return codex_task.capture("Go left one step.")


@needs_node
def test_codex_prompt_is_short_and_codex_own(codex_body):
    from polar_mq.dev.model_server.tokenizer import load_tokenizer

    assert codex_body["model"] == "policy" and codex_body["stream"] is True
    messages, tools = codex_task.chat(codex_body)
    assert [m["role"] for m in messages] == ["system", "user"]
    assert messages[0]["content"] == codex_task.INSTRUCTIONS.read_text().strip()
    assert messages[1]["content"] == "Go left one step."
    assert [t["function"]["name"] for t in tools] == ["exec_command", "write_stdin"]
    assert "cmd" in tools[0]["function"]["parameters"]["properties"]
    tok = load_tokenizer()
    n = len(tok.encode(tok.render(messages, tools=tools, add_generation_prompt=True)))
    assert 500 < n < 1500, n  # ~950: Codex's default prompt is ~9.2k
    # the prompt does not depend on the run (no cwd, date or ids): the base model's stamp is stable
    again = codex_task.capture("Go left one step.")
    assert codex_task.prompt_key(again) == codex_task.prompt_key(codex_body)


@needs_node
def test_turns_render_as_tool_call_then_text(codex_body):
    from polar_mq.dev.model_server.tokenizer import load_tokenizer

    tok = load_tokenizer()
    messages, tools = codex_task.first_turn(codex_body, "Move the cursor up.")
    prompt = tok.render(messages, tools=tools, add_generation_prompt=True)
    full = tok.render(messages + [codex_task.tool_call("up")], tools=tools, add_generation_prompt=False)
    reply = full[len(prompt):]
    assert reply.startswith("<tool_call>\n") and '"cmd": "echo up > answer.txt"' in reply
    messages2, _ = codex_task.second_turn(codex_body, "Move the cursor up.", "down", random.Random(0))
    assert messages2[-1]["role"] == "tool" and messages2[-1]["content"].startswith("Chunk ID: ")
    assert messages2[-2]["tool_calls"][0]["function"]["arguments"] == json.dumps({"cmd": "echo down > answer.txt"})


@pytest.mark.parametrize("written,target,ok", [("up\n", "up", True), ("down\n", "up", False), (None, "up", False),
                                               ("up up\n", "up", False)])
def test_check_answer(tmp_path, written, target, ok):
    if written is not None:
        (tmp_path / "answer.txt").write_text(written)
    r = subprocess.run([sys.executable, str(ROOT / "examples" / "grpo" / "check_answer.py")], cwd=tmp_path,
                       env={**os.environ, "TARGET": target}, capture_output=True, text=True)
    assert (r.returncode == 0) == ok
    assert ("PASSED test_answer_is_target" in r.stdout) == ok


def test_shared_prefix_forward_equals_plain_forward():
    """prefix_forward: the prefix computed once gives the plain forward's hidden states and gradients."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from examples.grpo.prefix_forward import hidden_states, shared_prefix

    torch.manual_seed(0)
    cfg = transformers.Qwen2Config(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=2, num_key_value_heads=2, head_dim=32,
                                   max_position_embeddings=1024)
    model = transformers.Qwen2ForCausalLM(cfg)
    pre = torch.randint(1, 300, (300,)).tolist()
    seqs = [pre + torch.randint(1, 300, (n,)).tolist() for n in (5, 20, 13)]
    assert shared_prefix(seqs) >= 300
    plain, off0 = hidden_states(model, seqs, 0, 290, min_shared=10**9)
    shared, off = hidden_states(model, seqs, 0, 290)
    assert (off0, off) == (0, 290)

    for i, s in enumerate(seqs):
        assert torch.allclose(plain[i, off:len(s)], shared[i, :len(s) - off], atol=1e-5)
    g_plain = torch.autograd.grad(sum(plain[i, off:len(s)].sum() for i, s in enumerate(seqs)),
                                  model.model.embed_tokens.weight)[0]
    shared, _ = hidden_states(model, seqs, 0, 290)
    g_shared = torch.autograd.grad(sum(shared[i, :len(s) - off].sum() for i, s in enumerate(seqs)),
                                   model.model.embed_tokens.weight)[0]
    assert torch.allclose(g_plain, g_shared, rtol=1e-4, atol=1e-3)
