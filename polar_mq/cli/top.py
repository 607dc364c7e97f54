"""`polar-mq top`: a live terminal view of a running polar_mq (rich).

Stage pools (workers, slots, busy) next to their queues, the READY buffer's occupancy against its
capacity, sessions by state and the finished counts, refreshed every `--interval` seconds from the
rollout API (`GET /ui/api/overview`, the same token as every client command).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

STAGES = ("init", "run", "postrun")


def _bar(n: int, capacity: int, width: int = 30) -> str:
    filled = 0 if capacity <= 0 else min(width, round(width * n / capacity))
    return "█" * filled + "·" * (width - filled)


def render(data: dict[str, Any], api_url: str, error: str | None = None):
    """One frame: a rich renderable built from an overview answer."""
    from rich.console import Group
    from rich.panel import Panel
    from rich.table import Table
    from rich.text import Text

    pools = Table(title="stage pools", expand=True)
    for col in ("stage", "queued", "workers", "slots", "busy"):
        pools.add_column(col, justify="left" if col == "stage" else "right")
    for stage in (*STAGES, *sorted(set(data.get("pools") or {}) - set(STAGES))):
        pool = (data.get("pools") or {}).get(stage) or {}
        pools.add_row(stage, str((data.get("queues") or {}).get(stage, 0)), str(pool.get("workers", 0)),
                      str(pool.get("concurrency", 0)), str(pool.get("busy", 0)))
    ready = data.get("ready") or {}
    cap = int(ready.get("capacity") or 0)
    held = int(ready.get("slots_held") or 0)
    waiting = int(ready.get("length") or 0)
    ready_text = Text.assemble(("READY  ", "bold"), f"{_bar(held, cap)}  {waiting} waiting, {held}/{cap} slots held",
                               ("  (paused)" if data.get("paused") else "", "yellow"),
                               f"   in flight at the gateway: {data.get('inflight', 0)}")
    states = Table(title="sessions by state", expand=True)
    states.add_column("state")
    states.add_column("sessions", justify="right")
    states.add_column("", ratio=1)
    sessions = data.get("sessions") or {}
    finished = data.get("finished") or {}
    active_total = max(1, sum(int(v) for v in sessions.values()))
    for name, n in sessions.items():
        states.add_row(name, str(n), f"[cyan]{_bar(int(n), active_total, 40)}[/]")
    for name, n in finished.items():
        colour = "green" if name == "COMPLETED" else "red" if name == "ERROR" else "yellow"
        states.add_row(f"[{colour}]{name}[/]", f"[{colour}]{n}[/]", "[dim]finished (total)[/]")
    footer = Text(f"{api_url}  ·  {time.strftime('%H:%M:%S', time.localtime(data.get('now') or time.time()))}"
                  + (f"  ·  pools: {data['pools_error']}" if data.get("pools_error") else ""), style="dim")
    parts: list[Any] = [pools, Panel(ready_text), states, footer]
    if error:
        parts.insert(0, Text(f"API error: {error}", style="bold red"))
    return Group(*parts)


def main(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.live import Live

    from polar_mq.client import ApiError, Client

    client = Client(url=args.api, token=args.token, timeout=10)
    console = Console()
    last: dict[str, Any] = {}
    shown = 0
    try:
        with Live(console=console, auto_refresh=False, screen=False) as live:
            while True:
                error = None
                try:
                    last = client.overview()
                except ApiError as exc:
                    error = str(exc)
                live.update(render(last, client.url, error), refresh=True)
                shown += 1
                if args.iterations and shown >= args.iterations:
                    return 1 if error else 0
                time.sleep(args.interval)
    except KeyboardInterrupt:
        return 0


def add_command(sub: argparse._SubParsersAction) -> None:
    top = sub.add_parser("top", help="live view of pools, queues, READY occupancy and sessions by state")
    top.add_argument("--interval", type=float, default=2.0, help="seconds between refreshes")
    top.add_argument("--iterations", type=int, default=0, help="stop after N refreshes (0: run until Ctrl-C)")
    top.add_argument("--api", help="API URL (default $POLAR_API_URL, else http://127.0.0.1:8700)")
    top.add_argument("--token", help="bearer token (default $POLAR_API_TOKEN)")
    top.set_defaults(func=main)
