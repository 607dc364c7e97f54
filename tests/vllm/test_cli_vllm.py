"""A real agent CLI (pi) -> gateway -> real vLLM -> prefix_merging: one trace of vLLM's own ids.

pi runs headless (each of its four wire APIs; openai-completions is the plain case) in a temporary HOME and work dir against a gateway session
whose upstream is the real vLLM server serving the overfit tiny model. The model was trained on pi's
real prompt (system prompt + read/bash/edit/write tools, from ``tests/replays/pi``; see
``scripts/build_tiny_model.py``) so that, decoding greedily, it calls pi's ``write`` tool for
polar.txt, then answers with a short final text once pi sends the tool result. We check what pi did
(exit 0, the file), what the gateway recorded (vLLM's sampled ids: /detokenize gives exactly the
text/tool call pi saw + the end-of-turn token; the same ids as a direct greedy vLLM call), the prefix
property between the two calls, and that prefix_merging builds exactly one trace that delivers all
of it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess

import pytest
import requests

from polar_mq.harnesses import install, pi

SERVED = "tiny"
EOT = "<|im_end|>"
INSTRUCTION = "Create the file polar.txt"
FILE_TEXT = "hello from polar"
FINAL_TEXT = "Done. I wrote polar.txt."
_TOOL_RE = re.compile(r"<tool_call>\n(.*?)\n</tool_call>", re.S)

pytestmark = pytest.mark.vllm

needs_node = pytest.mark.skipif(
    not install.npm_available(),
    reason="node/npm not on PATH: real harness CLIs cannot be installed or run")


@pytest.fixture(scope="session")
def pi_bin():
    try:
        return install.install(["pi"], timeout=600)["pi"]
    except install.InstallError as exc:  # e.g. the npm registry is unreachable
        pytest.skip(f"could not install pi from npm: {exc}")


def _detokenize(vllm_url: str, ids: list[int]) -> str:
    r = requests.post(f"{vllm_url}/detokenize", json={"model": SERVED, "tokens": list(ids)}, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()["prompt"]


def _tokenize(vllm_url: str, messages: list[dict], tools: list[dict] | None) -> list[int]:
    body = {"model": SERVED, "messages": messages, "add_generation_prompt": True}
    if tools:
        body["tools"] = tools
    r = requests.post(f"{vllm_url}/tokenize", json=body, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()["tokens"]


@pytest.mark.parametrize("api", ["openai_chat", "openai_responses", "anthropic", "gemini"])
@pytest.mark.cli
@needs_node
def test_pi_through_gateway_to_vllm_gives_one_trace(api, pi_bin, vllm_gateway, vllm_url, tmp_path):
    sess = vllm_gateway.new_session(metadata={"test": "pi-vllm", "api": api})
    home, work = tmp_path / "home", tmp_path / "work"
    work.mkdir()
    launch = pi.configure(home, sess["base_urls"], sess["key"], SERVED, INSTRUCTION,
                        api=api, bin=str(pi_bin))
    proc = subprocess.run(launch.argv, env={**os.environ, **launch.env}, cwd=work, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=120)
    calls = vllm_gateway.calls(sess["session_id"])
    detail = (f"argv={launch.argv}\nstdout={proc.stdout[-2000:]}\nstderr={proc.stderr[-2000:]}\n"
              f"calls={[(c.get('status'), c.get('finish_reason'), c.get('error')) for c in calls]}")

    # what pi did: ran the model's write call, printed the model's final text
    assert proc.returncode == 0, detail
    assert (work / "polar.txt").read_text() == FILE_TEXT, detail
    assert FINAL_TEXT in proc.stdout, detail

    # what the gateway recorded: two calls, vLLM's ids
    assert len(calls) >= 2, detail
    assert all(c["status"] == "ok" for c in calls), detail
    assert all(c["provider"] == api and c["model_served"] == SERVED for c in calls)
    first, second = calls[0], calls[1]
    assert [first["finish_reason"], second["finish_reason"]] == ["tool_calls", "stop"], detail
    # pi's real prompt, system prompt and tools included (~2k tokens)
    assert first["messages"][0]["role"] == "system" and "pi" in first["messages"][0]["content"]
    assert {t["function"]["name"] for t in first["tools"]} >= {"read", "bash", "edit", "write"}
    assert any(m.get("role") == "tool" for m in second["messages"]), second["messages"]

    seen = [
        {"text": "", "calls": [{"name": "write", "arguments": {"path": "polar.txt", "content": FILE_TEXT}}]},
        {"text": FINAL_TEXT, "calls": []},
    ]
    for rec, want in zip((first, second), seen):
        p, ids, lps = rec["prompt_token_ids"], rec["completion_token_ids"], rec["completion_logprobs"]
        assert p and ids and len(lps) == len(ids)
        assert all(isinstance(x, float) and x <= 0.0 for x in lps)
        # prompt ids: vLLM's rendering of exactly the recorded messages + tools
        assert p == _tokenize(vllm_url, rec["messages"], rec["tools"])
        # sampled ids: decoded by vLLM, exactly what pi got, then the end of turn
        raw = _detokenize(vllm_url, ids)
        assert raw.endswith(EOT), raw
        body = raw[: -len(EOT)]
        assert [json.loads(m.group(1)) for m in _TOOL_RE.finditer(body)] == want["calls"], raw
        assert _TOOL_RE.sub("", body).strip("\n") == want["text"], raw
    # what pi sent back as the assistant turn is the call it got from the first completion
    sent = [m for m in second["messages"] if m.get("role") == "assistant"][-1]
    assert [(tc["function"]["name"], json.loads(tc["function"]["arguments"])) for tc in sent["tool_calls"]] == \
        [("write", {"path": "polar.txt", "content": FILE_TEXT})]

    # the recorded ids are what vLLM samples for that prompt (greedy, direct call)
    direct = requests.post(f"{vllm_url}/v1/chat/completions", json={
        "model": SERVED, "messages": first["messages"], "tools": first["tools"], "max_tokens": 96,
        "temperature": 0, "return_token_ids": True}, timeout=120).json()
    assert direct["prompt_token_ids"] == first["prompt_token_ids"]
    assert direct["choices"][0]["token_ids"] == first["completion_token_ids"]

    # prefix property: call 2's prompt = call 1's prompt + call 1's sampled ids + the tool result
    head = first["prompt_token_ids"] + first["completion_token_ids"]
    assert second["prompt_token_ids"][: len(head)] == head
    assert len(second["prompt_token_ids"]) > len(head)

    # prefix_merging: one trace (the main chain) that delivers every call
    r = requests.get(f"{vllm_gateway.url}/sessions/{sess['session_id']}/trajectory", headers=vllm_gateway.admin_headers,
                     params={"builder": "prefix_merging"}, timeout=30)
    assert r.status_code == 200, r.text
    traj = r.json()
    stats = traj["stats"]
    assert stats["traces"] == 1, stats
    assert stats["delivered_fraction"] == 1.0, stats
    trace = traj["traces"][0]
    last = calls[-1]
    assert trace["prompt_ids"] + trace["response_ids"] == last["prompt_token_ids"] + last["completion_token_ids"]
