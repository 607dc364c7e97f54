"""A real agent CLI (pi, the smallest) completes a tool round trip through the gateway.

pi runs headless in a temporary HOME and work dir, configured by
:func:`polar_mq.harnesses.pi.configure` for each of its four wire APIs.  The stand-in model reads
the ``polar:path=`` directive, calls pi's write tool, and answers with final text after the tool
result.  We check the file pi's tool wrote, pi's exit status, the capture records, and the
prefix property between the two calls' token ids.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

from polar_mq import harnesses
from polar_mq.harnesses import codex, install, pi
from polar_mq.harnesses.base import PROVIDER_NAME

needs_node = pytest.mark.skipif(
    not install.npm_available(),
    reason="node/npm not on PATH: real harness CLIs cannot be installed or run")

INSTRUCTION = "Create the file polar.txt polar:path=polar.txt"
API_TO_PROVIDER = {
    "openai_chat": "openai_chat",
    "openai_responses": "openai_responses",
    "anthropic": "anthropic",
    "gemini": "gemini",
}


@pytest.fixture(scope="session")
def pi_bin():
    """pi's executable, installed from npm into the harness cache on first use."""
    try:
        return install.install(["pi"], timeout=600)["pi"]
    except install.InstallError as exc:  # e.g. the npm registry is unreachable
        pytest.skip(f"could not install pi from npm: {exc}")


def run_launch(launch: harnesses.CliLaunch, cwd, timeout: float = 45.0) -> subprocess.CompletedProcess:
    env = {**os.environ, **launch.env}
    return subprocess.run(launch.argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("api", list(API_TO_PROVIDER))
@pytest.mark.cli
@needs_node
def test_pi_tool_round_trip(api, pi_bin, gateway, tmp_path):
    sess = gateway.new_session(metadata={"test": "pi", "api": api})
    home, work = tmp_path / "home", tmp_path / "work"
    work.mkdir()
    launch = pi.configure(home, sess["base_urls"], sess["key"], "stand-in", INSTRUCTION,
                        api=api, bin=str(pi_bin))
    proc = run_launch(launch, work)
    detail = f"argv={launch.argv}\nstdout={proc.stdout[-2000:]}\nstderr={proc.stderr[-2000:]}"
    assert proc.returncode == 0, detail

    # The file was written by pi's tool (the stand-in only asked for it).
    assert (work / "polar.txt").read_text() == "hello from polar", detail
    assert "Done: the tool returned" in proc.stdout, detail

    calls = gateway.calls(sess["session_id"])
    assert len(calls) >= 2, calls
    for c in calls:
        assert c["status"] == "ok", c.get("error")
        assert c["provider"] == API_TO_PROVIDER[api]
        assert c["prompt_token_ids"] and c["completion_token_ids"]
        assert len(c["completion_logprobs"]) == len(c["completion_token_ids"])
    first, second = calls[0], calls[1]
    assert first["finish_reason"] == "tool_calls"
    assert first["response_message"]["tool_calls"]
    # The tool result went back to the model in the second call.
    assert any(m.get("role") == "tool" for m in second["messages"]), second["messages"]
    # Prefix property: call 2's prompt = call 1's prompt + call 1's sampled ids + the rest.
    head = first["prompt_token_ids"] + first["completion_token_ids"]
    assert second["prompt_token_ids"][: len(head)] == head
    assert len(second["prompt_token_ids"]) > len(head)


@pytest.mark.cli
@needs_node
def test_pi_unknown_key_is_rejected(pi_bin, gateway, tmp_path):
    """A CLI given a wrong key gets the provider's 401 and nothing is recorded."""
    sess = gateway.new_session()
    bad = {k: v.replace(sess["key"], "pmq-not-a-key") for k, v in sess["base_urls"].items()}
    home, work = tmp_path / "home", tmp_path / "work"
    work.mkdir()
    launch = pi.configure(home, bad, "pmq-not-a-key", "stand-in", INSTRUCTION, bin=str(pi_bin))
    proc = run_launch(launch, work)
    assert proc.returncode != 0
    assert not (work / "polar.txt").exists()
    assert gateway.calls(sess["session_id"]) == []


@pytest.mark.cli
@needs_node
def test_install_is_idempotent(pi_bin):
    """A second install of an installed harness is a no-op returning the same path."""
    cache = pi_bin.parents[3]  # <cache>/pi-<version>/node_modules/.bin/pi
    assert install.install(["pi"], cache)["pi"] == pi_bin
    assert install.bin_path("pi", cache) == pi_bin
    assert install.is_installed("pi", cache)
    assert shutil.which(str(pi_bin))


# ---- config builders (pure; no node needed) -----------------------------------------------------

BASE_URLS = {"anthropic": "http://gw:1/s/KEY", "openai": "http://gw:1/s/KEY/v1",
             "gemini": "http://gw:1/s/KEY"}


@pytest.mark.parametrize("harness,api", [(h, a) for h, apis in harnesses.supported_apis().items()
                                         for a in apis])
def test_config_builders_write_parseable_files(harness, api, tmp_path):
    import tomllib

    launch = harnesses.build(harness, tmp_path, BASE_URLS, "KEY", "m1", "do it", api=api)
    assert launch.harness == harness and launch.api == api
    assert launch.env["HOME"] == str(tmp_path)
    assert install.PACKAGES[harness].bin in launch.argv
    # The instruction reaches the CLI unaltered: an argv word, or a file fed on stdin.
    assert "do it" in launch.argv or any(f.read_text() == "do it" for f in launch.files)
    for f in launch.files:
        assert f.is_relative_to(tmp_path) and f.exists()
        text = f.read_text()
        if f.suffix in (".toml", ".json"):
            (tomllib.loads if f.suffix == ".toml" else json.loads)(text)
    # The key is handed over somewhere (env or a config file).
    assert "KEY" in json.dumps(launch.env) or any("KEY" in f.read_text() for f in launch.files)


def test_config_builders_reject_unsupported_api(tmp_path):
    with pytest.raises(ValueError):
        codex.configure(tmp_path, BASE_URLS, "KEY", "m1", "x", api="openai_chat")
    with pytest.raises(ValueError):
        harnesses.build("nope", tmp_path, BASE_URLS, "KEY", "m1", "x")


def test_pi_config_per_api(tmp_path):
    expected = {"openai_chat": ("openai-completions", "http://gw:1/s/KEY/v1"),
                "openai_responses": ("openai-responses", "http://gw:1/s/KEY/v1"),
                "anthropic": ("anthropic-messages", "http://gw:1/s/KEY"),
                "gemini": ("google-generative-ai", "http://gw:1/s/KEY/v1beta")}
    for api, (pi_api, base) in expected.items():
        launch = pi.configure(tmp_path / api, BASE_URLS, "KEY", "m1", "x", api=api)
        models = json.loads((tmp_path / api / ".pi/agent/models.json").read_text())
        prov = models["providers"][PROVIDER_NAME]
        assert (prov["api"], prov["baseUrl"], prov["apiKey"]) == (pi_api, base, "KEY")
        assert launch.argv[-1] == "x" and "polar/m1" in launch.argv
        assert launch.env["PI_OFFLINE"] == "1"


@pytest.fixture(scope="module")
def scripted_gateway(log_dir, redis_url, tmp_path_factory):
    """A gateway on a stand-in scripted to make three tool turns, then answer."""
    from tests.support.servers import GatewayHandle, start_gateway, start_model_server, stop

    script = tmp_path_factory.mktemp("script") / "steps.json"
    script.write_text(json.dumps([
        {"tool": "write", "arguments": {"path": "one.txt", "content": "1"}},
        {"tool": "write", "arguments": {"path": "two.txt", "content": "2"}},
        {"tool": "write", "arguments": {"path": "three.txt", "content": "3"}},
        {"text": "Wrote three files."},
    ]))
    ms = start_model_server(log_dir, "--scripted", str(script), "--max-model-len", "65536", name="ms-scripted")
    gw = start_gateway(log_dir, redis_url, [ms.url], name="gw-scripted")
    yield GatewayHandle(url=gw.url, upstream_url=ms.url, redis_url=redis_url, server=gw)
    stop(gw.proc)
    stop(ms.proc)


@pytest.mark.cli
@needs_node
def test_real_cli_session_merges_to_one_trace(pi_bin, scripted_gateway, tmp_path):
    """Several tool turns recorded from the real pi CLI: prefix_merging gives one trace for the
    main chain, every sampled token trainable (delivered_fraction 1.0)."""
    import requests

    sess = scripted_gateway.new_session()
    home, work = tmp_path / "home", tmp_path / "work"
    work.mkdir()
    launch = pi.configure(home, sess["base_urls"], sess["key"], "stand-in", "Write three files",
                        api="openai_chat", bin=str(pi_bin))
    proc = run_launch(launch, work)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert [(work / n).read_text() for n in ("one.txt", "two.txt", "three.txt")] == ["1", "2", "3"]
    calls = scripted_gateway.calls(sess["session_id"])
    assert [c["finish_reason"] for c in calls] == ["tool_calls"] * 3 + ["stop"]
    traj = requests.get(f"{scripted_gateway.url}/sessions/{sess['session_id']}/trajectory", headers=scripted_gateway.admin_headers,
                        params={"builder": "prefix_merging"}, timeout=30).json()
    assert traj["stats"]["traces"] == 1 and traj["stats"]["delivered_fraction"] == 1.0
    trace = traj["traces"][0]
    last = calls[-1]
    assert trace["prompt_ids"] + trace["response_ids"] == last["prompt_token_ids"] + last["completion_token_ids"]
    assert sum(trace["loss_mask"]) == sum(len(c["completion_token_ids"]) for c in calls)
    per_request = requests.get(f"{scripted_gateway.url}/sessions/{sess['session_id']}/trajectory", headers=scripted_gateway.admin_headers,
                               params={"builder": "per_request"}, timeout=30).json()
    assert per_request["stats"]["traces"] == 4
