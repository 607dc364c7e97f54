"""Harness shortcuts: config files in the session HOME, env, argv and options (no CLI run)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from polar_mq.harnesses import HarnessContext, get_harness

BASE_URLS = {"anthropic": "http://127.0.0.1:1/s/K", "openai": "http://127.0.0.1:1/s/K/v1",
             "gemini": "http://127.0.0.1:1/s/K"}


def ctx(tmp_path: Path, **options) -> HarnessContext:
    return HarnessContext(session_id="s1", instruction="do it", model="m1", key="K", base_urls=BASE_URLS,
                          home=tmp_path / "home", workdir=tmp_path / "work",
                          options={"bin": "/opt/cli", **options})


@pytest.mark.parametrize("name", ["claude_code", "codex", "gemini_cli", "qwen_code", "opencode", "pi"])
def test_every_cli_has_a_shortcut(name, tmp_path):
    launch = get_harness(name).launch(ctx(tmp_path, extra_args=["--extra"]))
    assert isinstance(launch.command, list) and "/opt/cli" in launch.command
    assert launch.command[-1] == "--extra"
    assert launch.env["HOME"] == str(tmp_path / "home") and launch.env["POLAR_SESSION_ID"] == "s1"
    assert any(p.is_file() for p in (tmp_path / "home").rglob("*"))  # its config files


def test_options(tmp_path):
    launch = get_harness("claude_code").launch(ctx(tmp_path, max_turns=3))
    assert launch.command[-2:] == ["--max-turns", "3"]
    get_harness("gemini_cli").launch(ctx(tmp_path / "g", max_turns=4))
    settings = json.loads((tmp_path / "g" / "home" / ".gemini" / "settings.json").read_text())
    assert settings["model"]["maxSessionTurns"] == 4
    get_harness("pi").launch(ctx(tmp_path / "p", api="anthropic"))
    models = json.loads((tmp_path / "p" / "home" / ".pi" / "agent" / "models.json").read_text())
    assert models["providers"]["polar"]["api"] == "anthropic-messages"
    launch = get_harness("qwen_code").launch(ctx(tmp_path / "q", api="gemini"))
    assert "gemini" in launch.command
    with pytest.raises(ValueError):
        get_harness("codex").launch(ctx(tmp_path / "c", max_turns=2))
    with pytest.raises(ValueError):
        get_harness("codex").launch(ctx(tmp_path / "c", api="anthropic"))
    with pytest.raises(ValueError):
        get_harness("pi").launch(ctx(tmp_path / "c", bogus=1))
