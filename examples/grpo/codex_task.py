"""The cursor task through the real Codex CLI: its configuration, its captured prompt, the reply shapes.

The harness is the pinned, unmodified ``codex`` binary (``polar_mq/harnesses/codex.py`` writes its
config.toml); only configuration differs from a user's run, passed as ``codex exec -c key=value``
overrides (``agent.options.extra_args``, :data:`OVERRIDES`): a short ``model_instructions_file``
(``codex_instructions.md``) instead of Codex's ~17k-character base prompt, and the optional parts
off (sub-agents, image viewing, goals, skills, web search, permission and environment context
messages). What stays is Codex's own wire: Responses over streaming HTTP, ``developer`` items,
its ``exec_command`` / ``write_stdin`` function tools; about 950 prompt tokens with the project's
tokenizer instead of ~9.2k.

The model solves the task with one ``exec_command`` call whose ``cmd`` is :func:`command`
(``echo up > answer.txt``); Codex runs it in the session's work dir, sends the output back, and the
model ends the turn with :data:`FINAL_TEXT`. ``check_answer.py`` (the test_runner's check, through
``grader.AnswerGrader``) reads ``answer.txt``.

:func:`capture` runs the pinned CLI once against a local capture server (the config the harness
writes + :data:`OVERRIDES`) and returns its first request body: the prompt the base policy is
trained on is Codex's actual one, converted by the gateway's own Responses adapter (:func:`chat`).
Guarded by tests/rl/test_codex_task.py.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from examples.grpo import task
from examples.grpo.cli_capture import run_against_recorder

HERE = Path(__file__).resolve().parent
INSTRUCTIONS = HERE / "codex_instructions.md"
ANSWER_FILE = "answer.txt"
FINAL_TEXT = "Done."
TOOL = "exec_command"

OVERRIDES = [
    f"model_instructions_file={json.dumps(str(INSTRUCTIONS))}",
    "include_permissions_instructions=false",
    "include_environment_context=false",
    "web_search=disabled",
    "agents.enabled=false",
    "features.multi_agent_v2=false",
    "features.view_image=false",
    "features.goals=false",
    "features.apps=false",
    "features.plugins=false",
    "skills.include_instructions=false",
    "tools.experimental_request_user_input.enabled=false",
]


def extra_args() -> list[str]:
    """``-c key=value`` words appended to ``codex exec`` (clap takes them after the prompt too)."""
    return [w for kv in OVERRIDES for w in ("-c", kv)]


def command(direction: str) -> str:
    return f"echo {direction} > {ANSWER_FILE}"


def tool_call(direction: str, call_id: str = "call_0") -> dict[str, Any]:
    """The assistant turn that solves the task (as the chat template renders it: a hermes tool call)."""
    return {"role": "assistant", "content": None,
            "tool_calls": [{"id": call_id, "type": "function",
                            "function": {"name": TOOL, "arguments": json.dumps({"cmd": command(direction)})}}]}


def tool_output(rng: random.Random) -> str:
    """What Codex 0.171 sends back for a command without output (the function_call_output of
    tests/replays/codex/openai_responses.json, with a fresh chunk id and wall time)."""
    chunk = "".join(rng.choice("0123456789abcdef") for _ in range(6))
    return (f"Chunk ID: {chunk}\nWall time: {rng.random() * 0.01:.4f} seconds\nProcess exited with code 0\n"
            "Original token count: 0\nOutput:\n")


def chat(body: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(messages, tools) of a Codex request body, as the gateway's Responses adapter sends them upstream."""
    from polar_mq.proxy_app.adapters.openai_responses import to_chat

    req = to_chat(body)
    return req.messages, req.tools


def first_turn(body: dict[str, Any], instruction: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The captured first request with its user message replaced by ``instruction``."""
    messages, tools = chat(body)
    users = [i for i, m in enumerate(messages) if m["role"] == "user"]
    if len(users) != 1:
        raise ValueError(f"expected one user message in the captured Codex request, found {len(users)}")
    messages = [dict(m) for m in messages]
    messages[users[0]]["content"] = with_task(messages[users[0]]["content"], instruction)
    return messages, tools


def with_task(content: str, instruction: str) -> str:
    """Codex's user message is the task alone."""
    return instruction


def second_turn(body: dict[str, Any], instruction: str, direction: str, rng: random.Random):
    """The request after the tool ran: the first turn + the tool call + Codex's tool output."""
    messages, tools = first_turn(body, instruction)
    call = tool_call(direction, call_id=f"chatcmpl-tool-{rng.getrandbits(64):016x}")
    return messages + [call, {"role": "tool", "tool_call_id": call["tool_calls"][0]["id"],
                              "content": tool_output(rng)}], tools


def capture(instruction: str = "Move the cursor up.", timeout: float = 120.0) -> dict[str, Any]:
    """Run the pinned Codex CLI with the harness's config + :data:`OVERRIDES` against a local
    server that records the request (and answers 400, so Codex stops); its first request body."""
    from polar_mq.harnesses.codex import configure
    from polar_mq.harnesses.npm import resolve_bin
    from polar_mq.harnesses.codex import PACKAGE

    def launch(url: str, home: Path, work: Path) -> tuple[list[str], dict[str, str]]:
        cli = configure(home, {"openai": url}, "capture-key", "policy", instruction, bin=str(resolve_bin(PACKAGE, {})))
        return cli.argv + extra_args(), {"PATH": "/usr/local/bin:/usr/bin:/bin", **cli.env}

    got = run_against_recorder(launch, b'{"error":{"message":"captured by examples.grpo.codex_task",'
                                       b'"type":"invalid_request_error"}}', timeout)
    assert got.proc is not None
    posts = got.posts()
    if not posts:
        raise RuntimeError(f"Codex sent no request (exit {got.proc.returncode}): {got.proc.stderr[-2000:]}")
    ignored = [line.strip() for line in got.proc.stderr.splitlines() if "session-flags" in line and "ignored" in line]
    if ignored:
        raise RuntimeError(f"Codex ignored part of the configuration: {ignored}")
    return json.loads(posts[0][1])


def prompt_key(body: dict[str, Any]) -> dict[str, Any]:
    """What of a captured body the model sees (no per-run ids): for caching and comparing."""
    messages, tools = chat(body)
    return {"messages": messages, "tools": tools}


DIRECTIONS = task.DIRECTIONS
