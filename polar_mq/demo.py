"""`polar-mq demo`: the gateway end to end on embedded defaults (no root, no GPU).

Starts an embedded Redis, the stand-in model server and the gateway, then makes one tool round
trip per provider API with the official SDKs (openai chat + responses, anthropic, google-genai) and
prints what the gateway captured.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from typing import Any, Callable

import requests

from .embedded_redis import free_port, start_embedded

WRITE_SCHEMA = {"type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
                "required": ["path", "content"]}
TASK = "Write hello into polar.txt"


def _spawn(args: list[str], health: str, log_path: str) -> subprocess.Popen:
    log = open(log_path, "wb")
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.time() + 120
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{args[2:4]} exited early; see {log_path}")
        try:
            if requests.get(health, timeout=1).status_code < 500:
                return proc
        except requests.RequestException:
            pass
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"{health} did not come up; see {log_path}")


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


def main() -> int:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    logs = tempfile.mkdtemp(prefix="polar-demo-")
    with ExitStack() as stack:
        redis_url = os.environ.get("POLAR_REDIS_URL")
        if not redis_url:
            server = start_embedded()
            stack.callback(server.stop)
            redis_url = server.url
        console.print(f"[bold]redis[/] {redis_url}")
        mport, gport = free_port(), free_port()
        with console.status("starting the stand-in model server and the gateway…"):
            ms = _spawn([sys.executable, "-m", "polar_mq.model_server", "--port", str(mport)],
                        f"http://127.0.0.1:{mport}/health", f"{logs}/model-server.log")
            stack.callback(ms.terminate)
            gw = _spawn([sys.executable, "-m", "polar_mq.cli", "gateway", "--port", str(gport),
                         "--redis", redis_url, "--upstream", f"http://127.0.0.1:{mport}", "--workers", "1"],
                        f"http://127.0.0.1:{gport}/health", f"{logs}/gateway.log")
            stack.callback(gw.terminate)
        gateway = f"http://127.0.0.1:{gport}"
        health = requests.get(f"{gateway}/health", timeout=5).json()
        console.print(f"[bold]gateway[/] {gateway}  upstream token ids: {health['token_ids']}")

        table = Table(title="captured model calls (one tool round trip per provider API)")
        for col in ("provider", "call", "stream", "prompt tokens", "sampled tokens", "finish reason",
                    "latency ms"):
            table.add_column(col, justify="right" if "tokens" in col or "ms" in col else "left")
        failures = 0
        for provider, round_trip in ROUND_TRIPS:
            session = requests.post(f"{gateway}/sessions", json={"metadata": {"demo": provider}},
                                    timeout=10).json()
            try:
                round_trip(session)
            except Exception as exc:  # show every provider even if one fails
                failures += 1
                console.print(f"[red]{provider} failed:[/] {type(exc).__name__}: {exc}")
            calls = requests.get(f"{gateway}/sessions/{session['session_id']}/calls", timeout=10).json()["calls"]
            for i, rec in enumerate(calls, 1):
                table.add_row(rec["provider"], str(i), "yes" if rec["stream"] else "no",
                              str(len(rec["prompt_token_ids"])), str(len(rec["completion_token_ids"])),
                              str(rec["finish_reason"] or rec["error"]), f"{rec['latency_ms']:.1f}")
            traj = requests.get(f"{gateway}/sessions/{session['session_id']}/trajectory",
                                params={"builder": "prefix_merging"}, timeout=10)
            if traj.ok:
                stats = traj.json()["stats"]
                console.print(f"{provider}: {stats.get('calls')} calls → {stats.get('traces')} trace(s) with "
                              f"prefix_merging, delivered_fraction {stats.get('delivered_fraction')}")
        console.print(table)
        console.print(f"logs: {logs}")
        return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
