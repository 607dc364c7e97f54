"""Token-in matching cost as a session grows: the session index (tito/index.py) vs reading and
matching the whole session (matching.find_parent over store.calls), side by side in one run.

A linear Claude Code session is grown in an embedded Redis, each call's record stored as the
gateway stores it: the history and the 26 tools of the largest recorded Claude Code request
(tests/replays/claude_code/anthropic.json, through the Anthropic adapter: its system prompt,
task and system reminder), then turns that repeat its recorded tool call and tool result with
fresh tool-call ids; at each checkpoint the
next call's lookup is timed both ways (the index warm: it has seen the calls before, as in a
running gateway; and cold: a fresh process's first lookup in that session). Both must pick the
same parent.

    python bench/bench_tito_index.py [--calls 50 150 300] [--repeat 5]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path

import redis
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from polar_mq.cli.embedded_redis import start_embedded  # noqa: E402
from polar_mq.model import CaptureRecord  # noqa: E402
from polar_mq.proxy_app.tito.index import SessionIndex  # noqa: E402
from polar_mq.proxy_app.tito.matching import find_parent  # noqa: E402
from polar_mq.store.core import GatewayStore  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_gateway import replay_request  # noqa: E402
from polar_mq.proxy_app.adapters import anthropic  # noqa: E402


def recorded_session() -> tuple[list[dict], tuple[dict, dict], list[dict]]:
    """(opening history, one recorded (tool call, tool result) turn, tools) of a real Claude Code
    request, as the gateway records them (chat messages, chat tools)."""
    req = anthropic.to_chat(replay_request())
    first = next(i for i, m in enumerate(req.messages) if m.get("tool_calls"))
    return req.messages[:first], (req.messages[first], req.messages[first + 1]), req.tools


def turn(recorded: tuple[dict, dict], k: int) -> tuple[dict, dict]:
    reply, result = copy.deepcopy(recorded)
    reply["tool_calls"][0]["id"] = result["tool_call_id"] = f"toolu_bench_{k}"
    return reply, result


def ms(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, nargs="+", default=[50, 150, 300])
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    console = Console()
    server = start_embedded()
    store = GatewayStore(redis.Redis.from_url(server.url))
    sid = "bench-session"
    messages, recorded, tools = recorded_session()
    warm = SessionIndex(store)
    table = Table(title="token-in lookup of the next call, ms (median), same run", min_width=90)
    for col in ("recorded calls", "messages", "whole session (before)", "index, warm", "index, cold",
                "before / warm"):
        table.add_column(col, justify="right")
    k = 0
    for target in sorted(args.calls):
        with console.status(f"growing the session to {target} calls…"):
            while k < target:
                reply, result = turn(recorded, k)
                store.append_call(CaptureRecord(
                    session_id=sid, provider="openai_chat", messages=list(messages), tools=tools,
                    response_message=reply, prompt_token_ids=list(range(1000, 1000 + 40 * len(messages))),
                    completion_token_ids=[5, 6, 7]))
                messages = messages + [reply, result]
                k += 1
                warm.find_parent(sid, messages, tools)  # a running gateway saw every call
        want = find_parent(messages, tools, store.calls(sid))
        assert warm.find_parent(sid, messages, tools).lineage == want.lineage == want.parent.call_id
        before = ms(lambda: find_parent(messages, tools, store.calls(sid)), args.repeat)
        hot = ms(lambda: warm.find_parent(sid, messages, tools), args.repeat)
        cold = ms(lambda: SessionIndex(store).find_parent(sid, messages, tools), args.repeat)
        table.add_row(str(target), str(len(messages)), f"{before:.1f}", f"{hot:.1f}", f"{cold:.1f}",
                      f"{before / hot:.0f}×")
    console.print(table)


if __name__ == "__main__":
    main()
