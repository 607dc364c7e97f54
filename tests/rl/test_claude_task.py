"""The Claude Code path of the GRPO example without a model: the pinned Claude Code CLI's prompt
under the example's configuration, the reply shapes, and the trainer's ``head_rows`` option.

``claude_task.capture`` runs the real, unmodified ``claude`` binary against a local recorder and
refuses a reduction that did not take effect (examples/grpo/claude_task.py); a scripted Anthropic
server then plays one whole session through the CLI: exactly two model calls, no side request.
"""

from __future__ import annotations

import http.server
import json
import random
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from examples.grpo import claude_task  # noqa: E402
from polar_mq.harnesses import install  # noqa: E402

needs_node = pytest.mark.skipif(not install.npm_available(), reason="node/npm not on PATH: Claude Code cannot run")


@pytest.fixture(scope="module")
def claude_body():
    try:
        install.install(["claude_code"], timeout=600)
    except install.InstallError as exc:  # e.g. the npm registry is unreachable
        pytest.skip(f"could not install claude_code from npm: {exc}")
    return claude_task.capture("Go left one step.")


@needs_node
def test_claude_prompt_is_short_and_claude_codes_own(claude_body):
    from polar_mq.dev.model_server.tokenizer import load_tokenizer

    assert claude_body["model"] == "policy" and claude_body["stream"] is True
    assert "thinking" not in claude_body  # CLAUDE_CODE_DISABLE_THINKING took effect
    assert [t["name"] for t in claude_body["tools"]] == ["Bash"]  # --tools Bash
    assert claude_body["system"][0]["text"].startswith("x-anthropic-billing-header:")  # the gateway strips it
    messages, tools = claude_task.chat(claude_body)
    assert [m["role"] for m in messages] == ["system", "user"]
    assert messages[0]["content"].endswith(claude_task.INSTRUCTIONS.read_text())  # --system-prompt-file
    assert "x-anthropic-billing-header" not in messages[0]["content"]
    assert messages[1]["content"].endswith("</system-reminder>\n\n\nGo left one step.")
    assert claude_task.DATE.search(messages[1]["content"])
    assert [t["function"]["name"] for t in tools] == ["Bash"]
    assert tools[0]["function"]["description"] == "execute shell commands"  # --bare's short description
    assert "command" in tools[0]["function"]["parameters"]["properties"]
    tok = load_tokenizer()
    n = len(tok.encode(tok.render(messages, tools=tools, add_generation_prompt=True)))
    assert 500 < n < 1500, n  # ~820: Claude Code's default request is ~80 KB with 26 tools
    # the prompt does not depend on the run (ids, cwd) nor, normalised, on the day: the base model's stamp is stable
    again = claude_task.capture("Go left one step.")
    assert claude_task.prompt_key(again) == claude_task.prompt_key(claude_body)
    assert "YYYY-MM-DD" in json.dumps(claude_task.prompt_key(claude_body))


def test_a_reduction_the_cli_ignored_is_refused():
    """check(): the default system prompt, more tools or thinking on are refused, not trained on."""
    body = {"model": "policy", "system": [{"type": "text", "text": "x" * 5000}], "thinking": {"type": "adaptive"},
            "tools": [{"name": "Bash", "description": "d"}, {"name": "Edit", "description": "d"}], "messages": []}
    with pytest.raises(RuntimeError, match="ignored part of the configuration") as exc:
        claude_task.check(body)
    assert "--tools Bash" in str(exc.value) and "--system-prompt-file" in str(exc.value)
    assert "CLAUDE_CODE_DISABLE_THINKING" in str(exc.value)


@needs_node
def test_turns_render_as_tool_call_then_text(claude_body):
    from polar_mq.dev.model_server.tokenizer import load_tokenizer

    tok = load_tokenizer()
    messages, tools = claude_task.first_turn(claude_body, "Move the cursor up.")
    assert messages[-1]["content"].endswith("</system-reminder>\n\n\nMove the cursor up.")
    prompt = tok.render(messages, tools=tools, add_generation_prompt=True)
    full = tok.render(messages + [claude_task.tool_call("up")], tools=tools, add_generation_prompt=False)
    reply = full[len(prompt):]
    assert reply.startswith("<tool_call>\n") and '"name": "Bash"' in reply
    assert '"command": "echo up > answer.txt"' in reply
    messages2, _ = claude_task.second_turn(claude_body, "Move the cursor up.", "down", random.Random(0))
    assert messages2[-1] == {"role": "tool", "tool_call_id": messages2[-2]["tool_calls"][0]["id"],
                             "content": "(Bash completed with no output)"}
    varied = claude_task.vary(messages, random.Random(3))
    assert varied[-1]["content"] != messages[-1]["content"] and claude_task.DATE.search(varied[-1]["content"])


class _Scripted(http.server.BaseHTTPRequestHandler):
    """An Anthropic Messages server that answers the task the way the base policy does: a Bash
    tool_use, then (after the tool result) a short text."""

    requests: list

    def do_HEAD(self) -> None:
        type(self).requests.append(("HEAD", self.path, None))
        self.send_response(200)
        self.send_header("content-length", "0")
        self.end_headers()

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("content-length") or 0)))
        type(self).requests.append(("POST", self.path, body))
        last = body["messages"][-1]["content"]
        done = isinstance(last, list) and any(b.get("type") == "tool_result" for b in last)
        if done:
            blocks, stop = [{"type": "text", "text": claude_task.FINAL_TEXT}], "end_turn"
        else:
            blocks, stop = [{"type": "tool_use", "id": "toolu_01", "name": "Bash",
                             "input": {"command": claude_task.command("up")}}], "tool_use"
        events = [{"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant",
                                                        "model": "policy", "content": [], "stop_reason": None,
                                                        "usage": {"input_tokens": 1, "output_tokens": 0}}}]
        for i, b in enumerate(blocks):
            if b["type"] == "text":
                events += [{"type": "content_block_start", "index": i, "content_block": {"type": "text", "text": ""}},
                           {"type": "content_block_delta", "index": i,
                            "delta": {"type": "text_delta", "text": b["text"]}}]
            else:
                events += [{"type": "content_block_start", "index": i, "content_block": {**b, "input": {}}},
                           {"type": "content_block_delta", "index": i,
                            "delta": {"type": "input_json_delta", "partial_json": json.dumps(b["input"])}}]
            events.append({"type": "content_block_stop", "index": i})
        events += [{"type": "message_delta", "delta": {"stop_reason": stop}, "usage": {"output_tokens": 5}},
                   {"type": "message_stop"}]
        data = "".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in events).encode()
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args) -> None:
        pass


@needs_node
def test_one_session_is_two_model_calls_and_no_side_request(claude_body):
    """The whole session through the real CLI: the Bash call runs and writes answer.txt, the tool
    result comes back as the gateway's second_turn expects, and nothing else is requested."""
    from polar_mq.harnesses.claude_code import PACKAGE, configure
    from polar_mq.harnesses.npm import resolve_bin

    handler = type("Scripted", (_Scripted,), {"requests": []})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            home, work = Path(tmp) / "home", Path(tmp) / "work"
            home.mkdir()
            work.mkdir()
            launch = configure(home, {"anthropic": f"http://127.0.0.1:{server.server_address[1]}"}, "k", "policy",
                               "Move the cursor up.", bin=str(resolve_bin(PACKAGE, {})))
            proc = subprocess.run(launch.argv + claude_task.extra_args(), cwd=work, capture_output=True, text=True,
                                  env={"PATH": "/usr/local/bin:/usr/bin:/bin", **launch.env, **claude_task.ENV},
                                  timeout=120)
            assert proc.returncode == 0, proc.stderr[-2000:]
            assert (work / "answer.txt").read_text() == "up\n"
    finally:
        server.shutdown()
        server.server_close()
    assert proc.stdout.strip() == claude_task.FINAL_TEXT
    posts = [(path, body) for method, path, body in handler.requests if method == "POST"]
    assert [p for p, _ in posts] == ["/v1/messages?beta=true"] * 2
    messages, _ = claude_task.chat(posts[1][1])
    expected, _ = claude_task.second_turn(claude_body, "Move the cursor up.", "up", random.Random(0))
    call_id = messages[-2]["tool_calls"][0]["id"]
    expected[-2]["tool_calls"][0]["id"] = expected[-1]["tool_call_id"] = call_id
    assert claude_task.with_date(messages, "D") == claude_task.with_date(expected, "D")


@pytest.mark.parametrize("head_rows", ["all", "sampled"])
def test_head_rows_sampled_keeps_the_unsampled_rows(tmp_path, head_rows):
    """trainer.PolicyTrainer(head_rows="sampled"): only the LM-head rows of tokens sampled in the batch
    move; with "all" AdamW moves every row, the never-sampled ones too (their ~1e-9 softmax
    gradients normalised to full-size steps: what broke Claude Code's tool-call format)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from examples.grpo.trainer import PolicyTrainer
    from polar_mq.rl.trainers.samples import TrainSample

    torch.manual_seed(0)
    cfg = transformers.Qwen2Config(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=2, head_dim=16,
                                   max_position_embeddings=128, tie_word_embeddings=False)
    transformers.Qwen2ForCausalLM(cfg).save_pretrained(tmp_path / "m")
    trainer = PolicyTrainer(tmp_path / "m", lr=1e-2, epochs=4, minibatches=1, trainable="lm_head",
                            head_rows=head_rows)
    before = trainer.model.lm_head.weight.detach().clone()
    samples = [TrainSample(prompt_ids=[5, 6, 7], response_ids=r, loss_mask=[1, 1], behaviour_logprobs=[-5.7, -5.7],
                           reward=rw, advantage=adv, group_id="g", session_id=f"s{i}")
               for i, (r, rw, adv) in enumerate([([10, 11], 1.0, 1.0), ([12, 11], 0.0, -1.0)])]
    stats = trainer.step(samples)
    assert stats.tokens_trained == 4
    moved = (trainer.model.lm_head.weight.detach() - before).abs().sum(1) > 0
    assert moved[[10, 11, 12]].all()
    others = torch.ones(300, dtype=torch.bool)
    others[[10, 11, 12]] = False
    assert bool(moved[others].any()) == (head_rows == "all")
