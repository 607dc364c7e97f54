"""The offline CLI proxy's reward rule (examples/grpo/cli_sim.py) is the grader's, per harness: a
well-formed call of the CLI's own tool, with the CLI's own argument name, that writes the right
direction to answer.txt (docs/rl.md, "Through the real Codex CLI" / "Through the real Claude Code
CLI"). The settings it chose are only as good as this rule."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")

from examples.grpo import claude_task, codex_task  # noqa: E402
from examples.grpo.cli_sim import verdict  # noqa: E402


def call(name: str, args: dict) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": args}) + "\n</tool_call>"


@pytest.mark.parametrize("t, arg", [(codex_task, "cmd"), (claude_task, "command")])
def test_the_right_call_of_the_clis_tool_is_rewarded(t, arg):
    assert verdict(t, call(t.TOOL, {arg: "echo up > answer.txt"}), "up") == (True, 1.0)
    # arguments as a JSON string (how the hermes parser may carry them) count the same
    assert verdict(t, call(t.TOOL, json.dumps({arg: "echo up > answer.txt"})), "up") == (True, 1.0)
    # well-formed, wrong direction or wrong file: the format holds, no reward
    assert verdict(t, call(t.TOOL, {arg: "echo down > answer.txt"}), "up") == (True, 0.0)
    assert verdict(t, call(t.TOOL, {arg: "echo up > other.txt"}), "up") == (True, 0.0)


@pytest.mark.parametrize("t, other_arg", [(codex_task, "command"), (claude_task, "cmd")])
def test_another_clis_call_or_broken_text_is_not_well_formed(t, other_arg):
    other_tool = claude_task.TOOL if t is codex_task else codex_task.TOOL
    assert verdict(t, call(t.TOOL, {other_arg: "echo up > answer.txt"}), "up") == (False, 0.0)
    assert verdict(t, call(other_tool, {other_arg: "echo up > answer.txt"}), "up") == (False, 0.0)
    assert verdict(t, "<tool_call>\n{\"namename\": \n</tool_call>", "up") == (False, 0.0)
    assert verdict(t, "up", "up") == (False, 0.0)


def test_the_task_replaces_only_what_follows_claude_codes_reminder():
    """The proxy's prompts are the base policy's: the harness's own ``with_task`` (which its
    ``first_turn`` uses) keeps the blank lines Claude Code puts after its reminder, as captured."""
    captured = "<system-reminder>\nToday's date is YYYY-MM-DD.\n</system-reminder>\n\n\nMove the cursor up."
    assert claude_task.with_task(captured, "Go left.") == (
        "<system-reminder>\nToday's date is YYYY-MM-DD.\n</system-reminder>\n\n\nGo left.")
    with pytest.raises(ValueError):
        claude_task.with_task("Move the cursor up.", "Go left.")
    assert codex_task.with_task("Move the cursor up.", "Go left.") == "Go left."  # Codex: the whole message
