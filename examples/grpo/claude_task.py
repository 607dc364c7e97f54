"""The cursor task through the real Claude Code CLI: its configuration, its captured prompt, the reply shapes.

The harness is the pinned, unmodified ``claude`` binary (``polar_mq/harnesses/claude_code.py``: env
only, ``claude -p TASK``); only configuration differs from a user's run, as extra argv words
(``agent.options.extra_args``, :data:`ARGS`) and env (``agent.options.env``, :data:`ENV`):
``--system-prompt-file claude_instructions.md`` (one sentence instead of Claude Code's ~30 KB
system prompt), ``--tools Bash`` (its own Bash tool only, of 26), ``--bare`` (no hooks, plugins,
memory, CLAUDE.md, skills or agent listings; the Bash tool's short description) and
``CLAUDE_CODE_DISABLE_THINKING=1`` (no ``thinking`` / ``context_management`` in the body). What
stays is Claude Code's wire: Anthropic Messages, streamed, its billing header line (the gateway
strips it), its ``<system-reminder>`` context with today's date in the user message, and its
``Bash`` tool: about 820 prompt tokens with the project's tokenizer instead of ~20k.

The model solves the task with one ``tool_use`` of ``Bash`` whose ``command`` is :func:`command`
(``echo up > answer.txt``; vLLM's hermes tool call, turned into a ``tool_use`` block by the
gateway); Claude Code runs it in the session's work dir, sends ``(Bash completed with no
output)`` back, and the model ends the turn with :data:`FINAL_TEXT`. ``check_answer.py`` (through
``grader.AnswerGrader``) reads ``answer.txt``.

With this configuration the CLI sends exactly two requests per solved session (the tool call, the
final text) and no side request (no title, quota or small-model call: the harness sets
``CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC`` and points every model alias at the policy); its
``HEAD /`` probe is answered by the gateway and records nothing. :func:`capture` checks each
reduction took effect and refuses the configuration otherwise. Guarded by
tests/rl/test_claude_task.py.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path
from typing import Any

from examples.grpo import task
from examples.grpo.cli_capture import run_against_recorder

HERE = Path(__file__).resolve().parent
INSTRUCTIONS = HERE / "claude_instructions.md"
ANSWER_FILE = "answer.txt"
FINAL_TEXT = "Done."
TOOL = "Bash"
TOOL_OUTPUT = "(Bash completed with no output)"  # what Claude Code 2.1.197 sends back for `echo … > file`
NAME = "claude_code"

ARGS = ["--system-prompt-file", str(INSTRUCTIONS), "--tools", TOOL, "--bare"]
ENV = {"CLAUDE_CODE_DISABLE_THINKING": "1"}
# Claude Code puts today's local date into every first user message; the base policy learns it on
# random dates, and the stamp of the base policy sees it normalised (prompt_key)
DATE = re.compile(r"Today's date is \d{4}-\d{2}-\d{2}\.")


def extra_args() -> list[str]:
    return list(ARGS)


def command(direction: str) -> str:
    return f"echo {direction} > {ANSWER_FILE}"


def tool_call(direction: str, call_id: str = "call_0") -> dict[str, Any]:
    """The assistant turn that solves the task (as the chat template renders it: a hermes tool call)."""
    return {"role": "assistant", "content": None,
            "tool_calls": [{"id": call_id, "type": "function",
                            "function": {"name": TOOL, "arguments": json.dumps({"command": command(direction)})}}]}


def chat(body: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(messages, tools) of a Claude Code request body, as the gateway's Anthropic adapter sends them upstream."""
    from polar_mq.proxy_app.adapters.anthropic import to_chat

    req = to_chat(body)
    return req.messages, req.tools


def with_date(messages: list[dict[str, Any]], date: str) -> list[dict[str, Any]]:
    """``messages`` with Claude Code's date line set to ``date`` (YYYY-MM-DD)."""
    return [{**m, "content": DATE.sub(f"Today's date is {date}.", m["content"])}
            if isinstance(m.get("content"), str) else m for m in messages]


def random_date(rng: random.Random) -> str:
    return f"{rng.randrange(2025, 2031)}-{rng.randrange(1, 13):02d}-{rng.randrange(1, 29):02d}"


def first_turn(body: dict[str, Any], instruction: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The captured first request with the task's instruction (the text after Claude Code's context
    reminder in its one user message) replaced by ``instruction``."""
    messages, tools = chat(body)
    users = [i for i, m in enumerate(messages) if m["role"] == "user"]
    if len(users) != 1:
        raise ValueError(f"expected one user message in the captured Claude Code request, found {len(users)}")
    messages = [dict(m) for m in messages]
    messages[users[0]]["content"] = with_task(messages[users[0]]["content"], instruction)
    return messages, tools


def with_task(content: str, instruction: str) -> str:
    """Claude Code's user message with its task (the text after the context reminder and the blank
    lines that follow it) replaced by ``instruction``."""
    head, sep, _ = content.rpartition("</system-reminder>\n")
    if not sep:
        raise ValueError("the captured Claude Code request has no context reminder before the task")
    rest = content[len(head) + len(sep):]
    return head + sep + rest[:len(rest) - len(rest.lstrip("\n"))] + instruction


def second_turn(body: dict[str, Any], instruction: str, direction: str, rng: random.Random):
    """The request after the tool ran: the first turn + the tool call + Claude Code's tool result."""
    messages, tools = first_turn(body, instruction)
    call = tool_call(direction, call_id=f"toolu_{rng.getrandbits(64):016x}")
    return messages + [call, {"role": "tool", "tool_call_id": call["tool_calls"][0]["id"],
                              "content": TOOL_OUTPUT}], tools


def vary(messages: list[dict[str, Any]], rng: random.Random) -> list[dict[str, Any]]:
    """A training variant of a prompt: another date (the only part of the request that changes between days)."""
    return with_date(messages, random_date(rng))


def capture(instruction: str = "Move the cursor up.", timeout: float = 120.0) -> dict[str, Any]:
    """Run the pinned Claude Code CLI with the harness's configuration + :data:`ARGS` / :data:`ENV`
    against a local server that records the request (and answers 400, so the CLI stops); its first
    request body. Raises when a reduction did not take effect (other tools, the default system
    prompt, thinking on) or the CLI sent a request other than the one model call."""
    from polar_mq.harnesses.claude_code import PACKAGE, configure
    from polar_mq.harnesses.npm import resolve_bin

    def launch(url: str, home: Path, work: Path) -> tuple[list[str], dict[str, str]]:
        cli = configure(home, {"anthropic": url}, "capture-key", "policy", instruction,
                        bin=str(resolve_bin(PACKAGE, {})))
        return cli.argv + extra_args(), {"PATH": "/usr/local/bin:/usr/bin:/bin", **cli.env, **ENV}

    got = run_against_recorder(launch, b'{"type":"error","error":{"type":"invalid_request_error",'
                                       b'"message":"captured by examples.grpo.claude_task"}}', timeout)
    assert got.proc is not None
    proc = got.proc
    posts = got.posts()
    if not posts:
        raise RuntimeError(f"Claude Code sent no request (exit {proc.returncode}): {proc.stderr[-2000:]}")
    if len(posts) != 1 or not posts[0][0].startswith("/v1/messages"):
        raise RuntimeError(f"Claude Code sent other requests than its one model call: {[p for p, _ in posts]}")
    body = json.loads(posts[0][1])
    check(body)
    return body


def check(body: dict[str, Any]) -> None:
    """Refuse a captured request in which a reduction of :data:`ARGS` / :data:`ENV` did not take effect."""
    problems = []
    names = [t.get("name") for t in body.get("tools") or []]
    if names != [TOOL]:
        problems.append(f"--tools {TOOL}: the request carries tools {names}")
    system = "\n".join(b.get("text", "") for b in body.get("system") or []) if isinstance(body.get("system"), list) \
        else str(body.get("system"))
    if INSTRUCTIONS.read_text().strip() not in system or len(system) > 1000:
        problems.append(f"--system-prompt-file: the system prompt is not the instructions file ({len(system)} chars)")
    if "thinking" in body:
        problems.append(f"CLAUDE_CODE_DISABLE_THINKING: the request asks for thinking {body['thinking']}")
    bash = (body.get("tools") or [{}])[0].get("description", "")
    if len(bash) > 200:
        problems.append(f"--bare: the Bash tool's description is the long one ({len(bash)} chars)")
    if problems:
        raise RuntimeError("Claude Code ignored part of the configuration: " + "; ".join(problems))


def prompt_key(body: dict[str, Any]) -> dict[str, Any]:
    """What of a captured body the model sees, the date normalised (no per-run ids): for caching and comparing."""
    messages, tools = chat(body)
    return {"messages": with_date(messages, "YYYY-MM-DD"), "tools": tools}


DIRECTIONS = task.DIRECTIONS
