"""Harness context windows and output limits come from the served model, not a hard-coded 32k.

Unit level: each harness shortcut with such a setting writes the served model's
`max_model_len` (or the task's override) into its config. End to end: the real opencode CLI,
with a long system prompt (AGENTS.md of ~35k tokens) and a 128k-context served model, completes
its tool round trip without compacting (with the old 32k window it compacted after every tool
call and looped until its budget ran out).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.support.servers import GatewayHandle, start_gateway, start_model_server, stop
from polar_mq.harnesses import HarnessContext, get_harness, install
from polar_mq.harnesses.limits import resolve

BASE_URLS = {"anthropic": "http://127.0.0.1:1/s/K", "openai": "http://127.0.0.1:1/s/K/v1",
             "gemini": "http://127.0.0.1:1/s/K"}


def ctx(tmp_path: Path, max_model_len: int | None = 131072, sampling: dict | None = None,
        **options) -> HarnessContext:
    return HarnessContext(session_id="s1", instruction="do it", model="m1", key="K", base_urls=BASE_URLS,
                          home=tmp_path / "home", workdir=tmp_path / "work",
                          options={"bin": "/opt/cli", **options}, max_model_len=max_model_len,
                          sampling=sampling or {})


def opencode_limit(tmp_path: Path) -> dict:
    cfg = json.loads((tmp_path / "home" / ".config" / "opencode" / "opencode.json").read_text())
    return cfg["provider"]["polar"]["models"]["m1"]["limit"]


def pi_model(tmp_path: Path) -> dict:
    return json.loads((tmp_path / "home" / ".pi" / "agent" / "models.json").read_text())["providers"]["polar"]["models"][0]


def test_window_from_the_served_model(tmp_path):
    get_harness("opencode").launch(ctx(tmp_path / "o"))
    assert opencode_limit(tmp_path / "o") == {"context": 131072, "output": 32768}
    get_harness("pi").launch(ctx(tmp_path / "p", max_model_len=65536))
    m = pi_model(tmp_path / "p")
    assert (m["contextWindow"], m["maxTokens"]) == (65536, 16384)
    get_harness("codex").launch(ctx(tmp_path / "c", max_model_len=200000))
    toml = (tmp_path / "c" / "home" / ".codex" / "config.toml").read_text()
    assert "model_context_window = 200000" in toml and "model_max_output_tokens = 32768" in toml
    launch = get_harness("claude_code").launch(ctx(tmp_path / "cc", sampling={"max_tokens": 8000}))
    assert launch.env["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] == "8000"


def gemini_settings(tmp_path: Path) -> dict:
    return json.loads((tmp_path / "home" / ".gemini" / "settings.json").read_text())


def qwen_provider(tmp_path: Path) -> dict:
    cfg = json.loads((tmp_path / "home" / ".qwen" / "settings.json").read_text())
    [entry] = cfg["modelProviders"][cfg["security"]["auth"]["selectedType"]]
    return entry


def test_gemini_cli_and_qwen_code_get_the_served_window(tmp_path):
    # Gemini CLI: no window setting; its compression threshold is a fraction of its own table's
    # window (1,048,576 for a model it does not know), so it compresses at half the served one.
    get_harness("gemini_cli").launch(ctx(tmp_path / "g", max_model_len=131072))
    cfg = gemini_settings(tmp_path / "g")
    assert cfg["model"]["compressionThreshold"] * 1_048_576 == pytest.approx(65536, abs=1)
    [override] = cfg["modelConfigs"]["customOverrides"]
    assert override == {"match": {"model": "m1"},
                        "modelConfig": {"generateContentConfig": {"maxOutputTokens": 32768}}}
    get_harness("gemini_cli").launch(ctx(tmp_path / "g2", max_model_len=8192, sampling={"max_tokens": 6000}))
    cfg = gemini_settings(tmp_path / "g2")  # the output cap must still fit: compress at 8192 - 6000
    assert cfg["model"]["compressionThreshold"] * 1_048_576 == pytest.approx(2192, abs=1)
    assert cfg["modelConfigs"]["customOverrides"][0]["modelConfig"]["generateContentConfig"] == {
        "maxOutputTokens": 6000}
    # Qwen Code: the provider entry's contextWindowSize, the output cap by its env variable
    launch = get_harness("qwen_code").launch(ctx(tmp_path / "q", max_model_len=65536))
    assert qwen_provider(tmp_path / "q")["generationConfig"] == {"contextWindowSize": 65536}
    assert launch.env["QWEN_CODE_MAX_OUTPUT_TOKENS"] == "16384"
    launch = get_harness("qwen_code").launch(ctx(tmp_path / "q2", context_window=50000, max_output_tokens=3000,
                                                 api="anthropic"))
    assert qwen_provider(tmp_path / "q2")["generationConfig"] == {"contextWindowSize": 50000}
    assert launch.env["QWEN_CODE_MAX_OUTPUT_TOKENS"] == "3000"


def test_task_overrides_and_sampling_cap(tmp_path):
    get_harness("opencode").launch(ctx(tmp_path / "o", context_window=50000, max_output_tokens=2000))
    assert opencode_limit(tmp_path / "o") == {"context": 50000, "output": 2000}
    get_harness("pi").launch(ctx(tmp_path / "p", sampling={"max_tokens": 1234}))
    assert pi_model(tmp_path / "p")["maxTokens"] == 1234
    with pytest.raises(ValueError, match="agent.options.context_window"):
        get_harness("opencode").launch(ctx(tmp_path / "x", context_window="big"))


def test_unknown_upstream_falls_back_and_says_so():
    lim = resolve(None)
    assert (lim.context_window, lim.source) == (32768, "fallback")
    assert resolve(131072).source == "upstream" and resolve(8192, {"context_window": 4096}).source == "task"
    assert resolve(1000, {"max_output_tokens": 5000}).max_output < 1000  # output never fills the window


# --- the real opencode CLI end to end ----------------------------------------------------------
BACKEND = "bwrap" if shutil.which("bwrap") else "local"
TASK_DIR = "/tmp/polar-task"


@pytest.fixture(scope="module")
def gateway_128k(log_dir, redis_url):
    ms = start_model_server(log_dir, "--max-model-len", "131072", name="ms-128k")
    gw = start_gateway(log_dir, redis_url, [ms.url], name="gw-128k")
    yield GatewayHandle(url=gw.url, upstream_url=ms.url, redis_url=redis_url, server=gw)
    stop(gw.proc)
    stop(ms.proc)


def long_system_prompt() -> str:
    """~120 KB of real project text as AGENTS.md (opencode puts it in its system prompt)."""
    root = Path(__file__).resolve().parents[2] / "polar_mq"
    text = "".join(p.read_text() for p in sorted(root.rglob("*.py")))[:120_000]
    return "# Project notes\n\nRead these notes before working.\n\n```\n" + text + "\n```\n"


@pytest.mark.cli
@pytest.mark.slow
@pytest.mark.timeout(1200)
@pytest.mark.skipif(not install.npm_available(), reason="node/npm not on PATH")
def test_opencode_long_system_prompt_128k_model_no_compaction_loop(gateway_128k, tmp_path_factory):
    from tests.support.pipeline import agent_task, make_pipeline
    from polar_mq import states

    try:
        install.install(["opencode"], timeout=900)
    except install.InstallError as exc:
        pytest.skip(f"could not install opencode from npm: {exc}")
    p = make_pipeline(gateway_128k, tmp_path_factory.mktemp("oc-128k"))
    for stage in ("init", "run", "postrun"):
        p.start_worker(stage, 1)
    try:
        workdir = TASK_DIR if BACKEND == "bwrap" else None
        target = f"{TASK_DIR}/polar.txt" if workdir else "polar.txt"
        runtime = {"backend": BACKEND, "prepare": [{"write": {"path": "AGENTS.md", "content": long_system_prompt()}}],
                   **({"workdir": workdir} if workdir else {})}
        _, [sid] = p.submit(agent_task(
            num_samples=1, timeout_seconds=240, instruction=f"Create the file {target} polar:path={target}",
            runtime=runtime, agent={"harness": "opencode", "model": "stand-in", "options": {}}))
        [rec] = p.wait([sid], timeout=300)
        assert rec.state == states.COMPLETED, (rec.state, rec.error)
        calls = gateway_128k.calls(rec.gateway_session_id)
        prompts = [len(c["prompt_token_ids"]) for c in calls]
        assert max(prompts) > 32768, prompts  # the system prompt alone overflows the old 32k window
        assert all(c["status"] == "ok" for c in calls)
        # title side call + tool call + final answer; a compaction loop makes dozens of calls
        assert len(calls) <= 5, [(c["messages"][-1].get("content") or "")[:80] for c in calls]
        # the loop seen with a 32k window repeated the same tool call after every compaction
        assert sum(c["finish_reason"] == "tool_calls" for c in calls) == 1
        traj = p.store.get_trajectory(sid)
        assert traj.status == "COMPLETED"
    finally:
        p.stop()
