"""The trainer's sub-commands of `polar-mq`: `groups next|ack|stats` and `admin pause|resume|status`.

Registered by client_cli.add_commands; each handler returns an exit code and prints JSON (one
group per line for `groups next`, so `| jq` and shell loops work).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Callable


def _run(args: argparse.Namespace, action: Callable[[Any], Any]) -> int:
    from polar_mq.client import ApiError, Client

    try:
        out = action(Client(url=args.api, token=args.token))
    except ApiError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2 if exc.status in (400, 404, 409) else 1
    if out is not None:
        print(json.dumps(out, indent=None if getattr(args, "compact", False) else 2))
    return 0


def _groups_next(args: argparse.Namespace) -> int:
    from polar_mq.client import ApiError, Client

    client = Client(url=args.api, token=args.token)
    try:
        groups = client.next_groups(limit=args.limit, wait=args.wait, lease=args.lease)
        for group in groups:
            if not args.with_trajectories:
                group = {**group, "trajectories": len(group["trajectories"])}
            print(json.dumps(group))
            if args.ack:
                client.ack_group(group["task_id"], reason="trained")
    except ApiError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0 if groups else 3  # 3: nothing finished within --wait


def add_commands(sub: argparse._SubParsersAction, api_flags: Callable[[argparse.ArgumentParser], None]) -> None:
    groups = sub.add_parser("groups", help="finished groups for a trainer: next, ack, stats")
    gsub = groups.add_subparsers(dest="groups_command", required=True)
    nxt = gsub.add_parser("next", help="lease finished groups (one JSON object a line; exit 3 if none)")
    nxt.add_argument("--limit", type=int, default=1)
    nxt.add_argument("--wait", type=float, default=0.0, help="seconds to wait for a group to finish")
    nxt.add_argument("--lease", type=float, default=300.0, help="seconds before an un-acked group is handed out again")
    nxt.add_argument("--with-trajectories", action="store_true", help="print whole trajectories (default: a count)")
    nxt.add_argument("--ack", action="store_true", help="ack each group as soon as it is printed")
    api_flags(nxt)
    nxt.set_defaults(func=_groups_next)
    ack = gsub.add_parser("ack", help="consume groups for good")
    ack.add_argument("task_ids", nargs="+")
    ack.add_argument("--reason", choices=("trained", "stale", "unusable", "skipped"))
    api_flags(ack)
    ack.set_defaults(func=lambda a: _run(a, lambda c: [c.ack_group(t, reason=a.reason) for t in a.task_ids]))
    stats = gsub.add_parser("stats", help="pending / leased / delivered / redelivered / acked counts")
    api_flags(stats)
    stats.set_defaults(func=lambda a: _run(a, lambda c: c.group_stats()))

    admin = sub.add_parser("admin", help="weight sync: pause, resume [--policy-version V], status")
    asub = admin.add_subparsers(dest="admin_command", required=True)
    pause = asub.add_parser("pause", help="stop new generations everywhere and wait for the ones in flight")
    pause.add_argument("--wait", type=float, help="seconds to wait for the drain (default: the API's pause_wait)")
    pause.add_argument("--mode", choices=("keep", "wait", "abort"), default="keep",
                       help="what vLLM upstreams with the RL API do with their own in-flight requests")
    api_flags(pause)
    pause.set_defaults(func=lambda a: _run(a, lambda c: _pause_or_fail(c, a)))
    resume = asub.add_parser("resume", help="resume generation; stamp later calls with --policy-version")
    resume.add_argument("--policy-version", type=int)
    api_flags(resume)
    resume.set_defaults(func=lambda a: _run(a, lambda c: c.resume(policy_version=a.policy_version)))
    status = asub.add_parser("status", help="paused?, in-flight per gateway, policy version, upstream weights")
    api_flags(status)
    status.set_defaults(func=lambda a: _run(a, lambda c: c.admin_status()))


def _pause_or_fail(client: Any, args: argparse.Namespace) -> Any:
    body = client.pause(wait=args.wait, mode=args.mode)
    if not body.get("drained"):
        print(f"warning: {body.get('in_flight')} generation(s) still in flight after the wait",
              file=sys.stderr)
    return body
