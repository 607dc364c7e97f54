"""Client-side sub-commands of `polar-mq`: api, submit, status, results, cancel.

`add_commands(subparsers)` registers them; each sets `func` to a handler returning an exit code.

Tests: tests/cli/test_client_cli.py.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from polar_mq.model import SessionState

STATE_ORDER = tuple(SessionState)
STATE_STYLE = {SessionState.COMPLETED: "green", SessionState.ERROR: "red", SessionState.TIMEOUT: "yellow",
               SessionState.RUNNING: "cyan"}


def _client(args: argparse.Namespace):
    from polar_mq.client import Client

    return Client(url=args.api, token=args.token)


def _api_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--api", help="API URL (default $POLAR_API_URL, else http://127.0.0.1:8700)")
    p.add_argument("--token", help="bearer token (default $POLAR_API_TOKEN, else $POLAR_HOME/token)")


def _err(msg: str) -> None:
    print(f"error: {msg}", file=sys.stderr)


# --- api ---------------------------------------------------------------------------------------
def _serve_api(args: argparse.Namespace) -> int:
    from polar_mq.api.serve import serve
    from polar_mq.cli.embedded_redis import ensure_redis
    from polar_mq.settings import PipelineSettings

    url, embedded = ensure_redis(args.redis)
    from polar_mq.cli.common import redact_url, redis_credentials_ok, service_token

    if embedded:
        print(f"started embedded redis at {redact_url(url)}", flush=True)
    elif not redis_credentials_ok(url, "hub"):
        return 2

    settings = PipelineSettings.from_env(redis_url=url)
    settings.api_token = service_token("api", dev=args.dev, explicit=args.token)
    serve(settings, host=args.host, port=args.port, dev=args.dev, workers=args.workers)
    return 0


# --- submit ------------------------------------------------------------------------------------
def _total_seconds(session: dict[str, Any]) -> float | None:
    timings = session.get("timings") or {}
    starts = [v for k, v in timings.items() if k.endswith("_start")]
    if not starts:
        return None
    return round(max(session.get("updated_at") or 0, *timings.values()) - min(starts), 1)


def summary_table(status: dict[str, Any]):
    from rich.table import Table

    table = Table(title=f"task {status['task_id']} — {status['state']}", show_lines=False)
    for col in ("session", "state", "attempt", "reward", "seconds", "error"):
        table.add_column(col, justify="right" if col in ("attempt", "reward", "seconds") else "left",
                         overflow="fold")
    for s in status.get("sessions") or []:
        state = s["state"]
        style = STATE_STYLE.get(state, "")
        reward = "" if s.get("reward") is None else f"{s['reward']:.3g}"
        secs = _total_seconds(s)
        table.add_row(s["session_id"], f"[{style}]{state}[/]" if style else state, str(s.get("attempt", 0)),
                      reward, "" if secs is None else str(secs), (s.get("error") or "")[:120])
    counts = ", ".join(f"{k}={v}" for k, v in (status.get("counts") or {}).items())
    mean = status.get("mean_reward")
    table.caption = counts + ("" if mean is None else f"; mean reward {mean:.3g}") + \
        (f"; {status['early_stopped']} early-stopped" if status.get("early_stopped") else "")
    return table


class _Progress:
    """A rich progress display: one bar per session state, plus the finished count."""

    def __init__(self, console) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.progress = Progress(TextColumn("{task.description:>12}"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), console=console, transient=False)
        self.rows: dict[str, Any] = {}

    def __enter__(self) -> "_Progress":
        self.progress.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.progress.__exit__(*exc)

    def update(self, status: dict[str, Any]) -> None:
        total = status.get("num_samples") or sum((status.get("counts") or {}).values()) or 1
        counts = status.get("counts") or {}
        if "finished" not in self.rows:
            self.rows["finished"] = self.progress.add_task("finished", total=total)
        self.progress.update(self.rows["finished"], completed=status.get("terminal", 0), total=total)
        for state in (*STATE_ORDER, *sorted(set(counts) - set(STATE_ORDER))):
            n = counts.get(state, 0)
            if state not in self.rows and n:
                self.rows[state] = self.progress.add_task(state, total=total)
            if state in self.rows:
                self.progress.update(self.rows[state], completed=n, total=total)


def _submit(args: argparse.Namespace) -> int:
    from rich.console import Console

    from polar_mq.client import ApiError

    if args.dataset:
        from polar_mq.cli.dataset import submit_dataset
        return submit_dataset(args)
    if not args.file:
        _err("give a TaskRequest file, or --dataset FILE")
        return 2
    client = _client(args)
    try:
        answer = client.submit(args.file, early_stop_min_usable_sessions=args.early_stop,
                               dispatch_priority=args.priority)
    except FileNotFoundError as exc:
        _err(str(exc))
        return 2
    except ApiError as exc:
        _err(str(exc))
        return 2 if exc.status == 400 else 1
    task_id = answer["task_id"]
    print(json.dumps(answer) if args.json else f"task {task_id}: {len(answer['session_ids'])} session(s)",
          flush=True)
    if not args.wait:
        return 0
    console = Console(stderr=True)
    try:
        with _Progress(console) as progress:
            final = client.wait(task_id, timeout=args.timeout, poll=args.poll, on_update=progress.update)
    except TimeoutError as exc:
        _err(str(exc))
        return 124
    except ApiError as exc:
        _err(str(exc))
        return 1
    except KeyboardInterrupt:
        _err(f"stopped waiting; the task keeps running (polar-mq status {task_id})")
        return 130
    if args.json:
        print(json.dumps(final))
    else:
        Console().print(summary_table(final))
    return 1 if (final.get("counts") or {}).get(SessionState.ERROR) else 0


# --- status / cancel ---------------------------------------------------------------------------
def _status(args: argparse.Namespace) -> int:
    from rich.console import Console

    from polar_mq.client import ApiError

    if args.cluster:
        return _cluster_status(args)
    if not args.task_id:
        _err("give a TASK_ID, or --cluster for the cluster's topology")
        return 2
    try:
        status = _client(args).status(args.task_id)
    except ApiError as exc:
        _err(str(exc))
        return 1
    if args.json:
        print(json.dumps(status, indent=2))
    else:
        Console().print(summary_table(status))
    return 0


def _cluster_status(args: argparse.Namespace) -> int:
    from rich.console import Console

    from polar_mq.cli.cluster_status import collect, render
    from polar_mq.store.pipeline import PipelineStore
    from polar_mq.settings import PipelineSettings
    from polar_mq.store.core import connect

    settings = PipelineSettings.from_env(redis_url=args.redis)
    view = collect(PipelineStore(connect(settings.redis_url)), settings.ready_capacity)
    if args.json:
        print(json.dumps(view, indent=2))
    else:
        Console().print(render(view))
    return 0


def _cancel(args: argparse.Namespace) -> int:
    from polar_mq.client import ApiError

    try:
        answer = _client(args).cancel(args.task_id)
    except ApiError as exc:
        _err(str(exc))
        return 1
    print(json.dumps(answer, indent=2))
    return 0


# --- results -----------------------------------------------------------------------------------
RESULTS_EPILOG = """\
--format sft and offline SFT (grader.config.keep_only_passing): when the task's trajectories carry
the grader's SFT verdicts (metadata "sft": accepted | rejected | error), only the accepted
trajectories are exported, as the rows of the workers' SFT file (OpenAI-chat messages + tools,
ids, reward, instance_id). The accepted / attempted counts are then printed on stderr: from the
SFT file's .stats.json when it is readable here (--sft-file, else the path the worker recorded in
the trajectories, else $POLAR_RESULTS_DIR/TASK_ID/sft.jsonl), otherwise computed from the fetched
trajectories (grader errors are not attempts). A file shared by several tasks (sft_path) has
counts of its own: the task's are printed next to them. --all exports every trajectory instead
(no SFT verdict filter); --status / --min-reward / --harness / --role filter as usual, and the
computed counts cover the trajectories they leave.
"""


def _default_results_dir() -> str:
    import os

    from polar_mq.settings import PipelineSettings

    return os.environ.get("POLAR_RESULTS_DIR") or PipelineSettings.results_dir


def _sft_counts(task_id: str, trajs: list[Any], verdicts: dict[str, Any], sft_file: str | None) -> str:
    """The offline-SFT summary line: the stats file's counts when it is here, else computed."""
    from pathlib import Path

    from polar_mq.graders.sft import stats_path, summarize

    def fmt(c: dict[str, Any]) -> str:
        return (f"{c['accepted']} accepted / {c['attempted']} attempted ({c['acceptance_rate']:.1%}), "
                f"{c['errors']} grader error(s)")

    recorded = [(t.metadata or {}).get("sft_file") for t in trajs]
    candidates = [sft_file] if sft_file else [*dict.fromkeys(r for r in recorded if r),
                                              str(Path(_default_results_dir()) / task_id / "sft.jsonl")]
    task_counts = summarize(verdicts.values())
    for path in candidates:
        stats_file = stats_path(Path(path))
        try:
            stats = json.loads(stats_file.read_text())
        except (OSError, ValueError):
            continue
        sessions = stats.get("sessions") or {}
        line = f"offline SFT: {fmt({**summarize(sessions.values()), **stats})}, {stats.get('rows', 0)} row(s) " \
               f"in {path} (counts from {stats_file})"
        if set(sessions) - set(verdicts):  # shared with other tasks
            line += f"; this task: {fmt(summarize(sessions.get(sid, v) for sid, v in verdicts.items()))}"
        return line
    where = candidates[0] if candidates else "the SFT file"
    return (f"offline SFT: {fmt(task_counts)} (computed from the results: {where}.stats.json is not on this "
            f"machine; it is on the workers, under their results dir)")


def _results(args: argparse.Namespace) -> int:
    from polar_mq.client import ApiError
    from polar_mq.rl.export import as_trajectory
    from polar_mq.rl.export import export
    from polar_mq.rl.export import select
    from polar_mq.rl.export import write_jsonl
    from polar_mq.graders.sft import offline_sft_rows

    if args.format == "parquet" and not args.out:
        _err("--format parquet needs --out FILE")
        return 2
    try:
        answer = _client(args).results(args.task_id, status=args.status, min_reward=args.min_reward)
    except ApiError as exc:
        _err(str(exc))
        return 1
    roles = args.role or None
    trajs = select(answer["trajectories"], harness=args.harness)
    verdicts = {t.session_id: (t.metadata or {}).get("sft") for t in trajs}
    verdicts = {sid: v for sid, v in verdicts.items() if v in ("accepted", "rejected", "error")}
    waiting = answer.get("sessions_without_trajectory") or []
    note = f"; {len(waiting)} session(s) without a trajectory yet" if waiting else ""
    dest = " → " + args.out if args.out else ""
    if args.format == "sft" and verdicts and not args.all:
        accepted = [t for t in trajs if verdicts.get(t.session_id) == "accepted"]
        n = write_jsonl(offline_sft_rows(accepted, roles=roles), args.out or "-")
        print(f"{n} row(s) from {len(accepted)} accepted of {len(trajs)} trajectorie(s) of task "
              f"{args.task_id}{dest}{note}", file=sys.stderr)
        print(_sft_counts(args.task_id, trajs, verdicts, args.sft_file), file=sys.stderr)
        return 0
    n = export([as_trajectory(t) for t in trajs], args.out or "-", args.format, roles=roles)
    print(f"{n} row(s) from {len(trajs)} trajectorie(s) of task {args.task_id}{dest}{note}", file=sys.stderr)
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:
    api = sub.add_parser("api", help="serve the rollout API")
    api.add_argument("--host", default="127.0.0.1")
    api.add_argument("--port", type=int, default=8700)
    api.add_argument("--redis", help="Redis URL (default $POLAR_REDIS_URL, else an embedded Redis)")
    api.add_argument("--token", help="require this bearer token (default $POLAR_API_TOKEN, "
                                     "$POLAR_GATEWAY_TOKEN, else $POLAR_HOME/token, generated if missing)")
    api.add_argument("--workers", type=int, help="gunicorn worker processes")
    api.add_argument("--dev", action="store_true",
                     help="werkzeug threaded server instead of gunicorn; open unless a token is set")
    api.set_defaults(func=_serve_api)

    submit = sub.add_parser("submit", help="submit a TaskRequest (YAML or JSON file), or a dataset (--dataset)")
    submit.add_argument("file", nargs="?")
    from polar_mq.cli.dataset import add_flags
    add_flags(submit)
    submit.add_argument("--wait", action="store_true", help="follow the sessions until all are finished")
    submit.add_argument("--timeout", type=float, help="with --wait: give up after SECONDS (exit 124)")
    submit.add_argument("--poll", type=float, default=1.0, help="with --wait: seconds between polls")
    submit.add_argument("--json", action="store_true", help="print JSON instead of tables")
    _api_flags(submit)
    submit.set_defaults(func=_submit)

    status = sub.add_parser("status", help="show a task's sessions")
    status.add_argument("task_id", nargs="?")
    status.add_argument("--json", action="store_true")
    status.add_argument("--cluster", action="store_true",
                        help="nodes, pools, queue depths and READY occupancy (from Redis)")
    status.add_argument("--redis", help="Redis URL for --cluster (default $POLAR_REDIS_URL)")
    _api_flags(status)
    status.set_defaults(func=_status)

    results = sub.add_parser("results", help="fetch a task's trajectories (JSONL, Parquet or SFT)",
                             description="Fetch a task's trajectories as token-level JSONL / Parquet rows or "
                                         "SFT chat JSONL.", epilog=RESULTS_EPILOG,
                             formatter_class=argparse.RawDescriptionHelpFormatter)
    results.add_argument("task_id")
    results.add_argument("--out", help="output file (default stdout; required for parquet)")
    results.add_argument("--format", choices=("jsonl", "parquet", "sft"), default="jsonl")
    results.add_argument("--status", help="only these trajectory statuses (comma-separated)")
    results.add_argument("--min-reward", type=float)
    results.add_argument("--harness", help="only trajectories of this harness")
    results.add_argument("--role", action="append", help="only traces with this role (main, side, subagent...)")
    results.add_argument("--all", action="store_true",
                         help="with --format sft: every trajectory, not only those offline SFT accepted")
    results.add_argument("--sft-file", help="with --format sft: the offline SFT file whose .stats.json has the "
                                            "counts (default: the path the workers recorded)")
    _api_flags(results)
    results.set_defaults(func=_results)

    cancel = sub.add_parser("cancel", help="cancel a task")
    cancel.add_argument("task_id")
    _api_flags(cancel)
    cancel.set_defaults(func=_cancel)

    from polar_mq.cli import trainer as cli_trainer
    cli_trainer.add_commands(sub, _api_flags)
