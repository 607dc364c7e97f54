"""`polar-mq demo`: the gateway end to end on embedded defaults (no root, no GPU).

Starts an embedded Redis, the stand-in model server and the gateway, then makes one tool round
trip per provider API with the official SDKs (openai chat + responses, anthropic, google-genai) and
prints what the gateway captured.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Callable

import requests

from polar_mq.cli.common import viewer_link
from polar_mq.cli.embedded_redis import free_port
from polar_mq.model import SessionState

WRITE_SCHEMA = {"type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
                "required": ["path", "content"]}
TASK = "Write hello into polar.txt"


def _openai_chat(s: dict[str, Any]) -> None:
    import openai

    c = openai.OpenAI(base_url=s["base_urls"]["openai"], api_key=s["key"])
    tools = [{"type": "function", "function": {"name": "write", "parameters": WRITE_SCHEMA}}]
    msgs: list[dict[str, Any]] = [{"role": "user", "content": TASK}]
    first = c.chat.completions.create(model="demo-policy", messages=msgs, tools=tools)
    call = first.choices[0].message.tool_calls[0]
    msgs += [first.choices[0].message.model_dump(exclude_none=True),
             {"role": "tool", "tool_call_id": call.id, "content": "ok, 5 bytes written"}]
    c.chat.completions.create(model="demo-policy", messages=msgs, tools=tools)


def _openai_responses(s: dict[str, Any]) -> None:
    import openai

    c = openai.OpenAI(base_url=s["base_urls"]["openai"], api_key=s["key"])
    tools = [{"type": "function", "name": "write", "parameters": WRITE_SCHEMA}]
    first = c.responses.create(model="demo-policy", input=TASK, tools=tools)
    call = next(item for item in first.output if item.type == "function_call")
    items = [{"role": "user", "content": TASK}, call.model_dump(exclude_none=True),
             {"type": "function_call_output", "call_id": call.call_id, "output": "ok, 5 bytes written"}]
    with c.responses.stream(model="demo-policy", input=items, tools=tools) as stream:
        stream.get_final_response()


def _anthropic(s: dict[str, Any]) -> None:
    import anthropic

    c = anthropic.Anthropic(base_url=s["base_urls"]["anthropic"], api_key=s["key"])
    tools = [{"name": "write", "description": "Write a file", "input_schema": WRITE_SCHEMA}]
    msgs: list[dict[str, Any]] = [{"role": "user", "content": TASK}]
    first = c.messages.create(model="demo-policy", max_tokens=256, messages=msgs, tools=tools)
    use = next(b for b in first.content if b.type == "tool_use")
    msgs += [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
             {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                           "content": "ok, 5 bytes written"}]}]
    with c.messages.stream(model="demo-policy", max_tokens=256, messages=msgs, tools=tools) as stream:
        stream.get_final_message()


def _gemini(s: dict[str, Any]) -> None:
    from google import genai
    from google.genai import types

    c = genai.Client(api_key=s["key"], http_options=types.HttpOptions(base_url=s["base_urls"]["gemini"]))
    decl = types.FunctionDeclaration(name="write", parameters_json_schema=WRITE_SCHEMA)
    config = types.GenerateContentConfig(
        tools=[types.Tool(function_declarations=[decl])],
        automatic_function_calling=types.AutomaticFunctionCallingConfig(disable=True))
    contents: list[Any] = [types.Content(role="user", parts=[types.Part(text=TASK)])]
    first = c.models.generate_content(model="demo-policy", contents=contents, config=config)
    call = first.function_calls[0]
    contents += [first.candidates[0].content,
                 types.Content(role="user", parts=[types.Part(function_response=types.FunctionResponse(
                     id=call.id, name=call.name, response={"result": "ok, 5 bytes written"}))])]
    for _ in c.models.generate_content_stream(model="demo-policy", contents=contents, config=config):
        pass


ROUND_TRIPS: list[tuple[str, Callable[[dict[str, Any]], None]]] = [
    ("openai_chat", _openai_chat), ("openai_responses", _openai_responses),
    ("anthropic", _anthropic), ("gemini", _gemini),
]


def _gateway_round_trips(console, gateway: str, admin: dict[str, str]) -> int:
    """Part 1: one tool round trip per provider API through the gateway; a table of captures."""
    from rich.table import Table

    table = Table(title="gateway: one tool round trip per provider API (official SDKs)")
    for col in ("provider", "call", "stream", "prompt tokens", "sampled tokens", "finish reason", "traces"):
        table.add_column(col, justify="right" if "tokens" in col or col == "traces" else "left")
    failures = 0
    for provider, round_trip in ROUND_TRIPS:
        session = requests.post(f"{gateway}/sessions", json={"metadata": {"demo": provider}}, headers=admin,
                                timeout=10).json()
        try:
            round_trip(session)
        except Exception as exc:  # show every provider even if one fails
            failures += 1
            console.print(f"[red]{provider} failed:[/] {type(exc).__name__}: {exc}")
        calls = requests.get(f"{gateway}/sessions/{session['session_id']}/calls", headers=admin,
                             timeout=10).json()["calls"]
        traj = requests.get(f"{gateway}/sessions/{session['session_id']}/trajectory", headers=admin,
                            params={"builder": "prefix_merging"}, timeout=10).json()
        for i, rec in enumerate(calls, 1):
            table.add_row(rec["provider"], str(i), "yes" if rec["stream"] else "no",
                          str(len(rec["prompt_token_ids"])), str(len(rec["completion_token_ids"])),
                          str(rec["finish_reason"] or rec["error"]),
                          str(traj.get("stats", {}).get("traces", "?")) if i == len(calls) else "")
    console.print(table)
    return failures


def _pipeline(console, api_url: str, token: str | None, out_dir: Path) -> int:
    """Part 2: a task with several samples through init → READY → run → postrun."""
    from rich.progress import BarColumn, Progress, TextColumn
    from rich.table import Table

    from polar_mq.client import Client
    from polar_mq.rl.export import token_rows
    from polar_mq.rl.export import write_jsonl

    agent = Path(__file__).resolve().parents[2] / "examples" / "tiny_agent.py"
    client = Client(api_url, token=token)
    task = {"instruction": "Write hello into polar.txt", "num_samples": 4, "timeout_seconds": 120,
            "agent": {"harness": "shell", "model": "demo-policy",
                      "options": {"command": [sys.executable, str(agent)]}},
            "runtime": {"backend": "local"}, "builder": {"strategy": "prefix_merging"},
            "grader": {"strategy": "completion"}, "metadata": {"group_id": "demo"}}
    sub = client.submit(task)
    # BUILDING and EVALUATING count as POST_RUN: postrun is one bar
    states = [st for st in SessionState if st not in (SessionState.BUILDING, SessionState.EVALUATING)]
    with Progress(TextColumn("{task.description:>12}"), BarColumn(), TextColumn("{task.completed:.0f}"),
                  console=console, transient=True) as progress:
        bars = {st: progress.add_task(st, total=task["num_samples"]) for st in states}

        def update(status: dict[str, Any]) -> None:
            counts = {st: 0 for st in states}
            for sess in status["sessions"]:
                counts[sess["state"] if sess["state"] in counts else SessionState.POST_RUN] += 1
            for st, bar in bars.items():
                progress.update(bar, completed=counts[st])

        status = client.wait(sub["task_id"], timeout=300, poll=0.3, on_update=update)
    results = client.results(sub["task_id"])["trajectories"]
    by_sid = {t["session_id"]: t for t in results}
    table = Table(title=f"pipeline: task {sub['task_id']} ({task['num_samples']} samples, shell harness + tiny agent)")
    for col in ("session", "state", "init s", "queue s", "run s", "postrun s", "calls", "traces",
                "delivered", "reward"):
        table.add_column(col, justify="left" if col in ("session", "state") else "right")
    for sess in status["sessions"]:
        t = sess.get("timings") or {}
        traj = by_sid.get(sess["session_id"], {})
        stats = traj.get("stats", {})

        def span(a: str, b: str) -> str:
            return f"{t[b] - t[a]:.2f}" if a in t and b in t else "-"

        table.add_row(sess["session_id"][-8:], sess["state"], span("initializing_start", "ready_start"),
                      span("ready_start", "running_start"), span("running_start", "post_run_start"),
                      span("post_run_start", "post_run_end") if "post_run_end" in t else
                      span("post_run_start", "building_end"),
                      str(stats.get("calls", "-")), str(stats.get("traces", "-")),
                      str(stats.get("delivered_fraction", "-")), str(traj.get("reward", "-")))
    console.print(table)
    out = out_dir / sub["task_id"] / "traces.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    rows = write_jsonl(token_rows(results), out)
    console.print(f"results: {rows} trace rows written to [bold]{out}[/] "
                  f"(also: polar-mq results {sub['task_id']} --format parquet --out FILE)")
    return sum(1 for s in status["sessions"] if s["state"] != SessionState.COMPLETED)


def _ask_keep() -> bool:
    """At the end of an interactive `make demo`: keep it running? (never asked without a TTY)."""
    if not sys.stdin.isatty():
        return False
    try:
        return input("Keep everything running to explore the viewer? [y/N] ").strip().lower() in ("y", "yes")
    except EOFError:
        return False


def _stop_on_sigterm() -> None:
    """SIGTERM unwinds like Ctrl-C, so the `finally` below stops every child (they run in their
    own sessions: nothing else would end them)."""
    import signal

    def interrupt(signum, frame):  # noqa: ARG001
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)


def main(keep: bool = False, ask_keep: bool = False, harness: str | None = None) -> int:
    """The demo; `keep`: leave every service running afterwards, print the viewer link that signs
    the browser in, stop on Ctrl-C/SIGTERM (tests/cli/test_demo_keep.py). `harness`: also run that
    agent CLI for real against the stand-in (demo_harness.py)."""
    from rich.console import Console

    from polar_mq.cli.up import launch

    import shutil

    _stop_on_sigterm()
    console = Console(width=max(110, shutil.get_terminal_size().columns))
    if harness is not None:
        from polar_mq.cli.demo_harness import ensure_installed

        try:
            ensure_installed(console, harness)  # before anything starts: a download shows its progress
        except RuntimeError as exc:
            console.print(f"[red]{exc}[/]")
            return 1
    with console.status("starting redis, the stand-in model, the gateway, the API and the worker pools…"):
        stack = launch(api_port=free_port(), gateway_port=free_port(), flower=False,
                       concurrency=(2, 2, 1))
    try:
        console.print("[bold]polar_mq demo[/] (embedded defaults, no GPU)\n" + stack.describe())
        failures = _gateway_round_trips(console, stack.gateway_url, stack.gateway_headers)
        from polar_mq.settings import PipelineSettings

        # Next to the per-session result files the postrun workers write (a per-user directory).
        failures += _pipeline(console, stack.api_url, stack.token, Path(PipelineSettings.from_env().results_dir))
        if harness is not None:
            from polar_mq.cli.demo_harness import run_harness

            try:
                failures += run_harness(console, harness, stack, keep=keep)
            except Exception as exc:  # shown; with --keep the deployment stays up to look into it
                failures += 1
                console.print(f"[red]{harness} failed:[/] {type(exc).__name__}: {exc}")
        if keep or (ask_keep and _ask_keep()):
            print(f"\nviewer: {viewer_link(stack.api_url, stack.token)}  (signs this browser in)\n"
                  f"everything keeps running (API {stack.api_url}, gateway {stack.gateway_url}); "
                  f"Ctrl-C stops it", flush=True)
            if stack.supervisor.watch():
                failures += 1
        return 1 if failures else 0
    except KeyboardInterrupt:
        return 130
    finally:
        stack.stop()


if __name__ == "__main__":
    sys.exit(main())
