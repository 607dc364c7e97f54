"""`polar-mq token [create|list|revoke]`: the admin token, and scoped tokens (roles.py).

`polar-mq token` alone prints the admin token (README's `$(polar-mq token)`); `create` prints a
new scoped token once, `list` shows names, roles and expiry (never tokens), `revoke NAME` ends
one at once. They go through the API with the admin token (`--api`, $POLAR_API_URL), or straight
to Redis with `--redis URL` (before any API is up; the tokens live in Redis either way).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from polar_mq.api.roles import ROLES


def add_subcommands(tok: argparse.ArgumentParser) -> None:
    sub = tok.add_subparsers(dest="token_command")
    create = sub.add_parser("create", help="make a scoped token and print it (once)")
    create.add_argument("--role", required=True, choices=ROLES)
    create.add_argument("--name", help="a name for list/revoke (default ROLE-<random>)")
    create.add_argument("--ttl", type=float, metavar="SECONDS", help="expire after this many seconds")
    sub.add_parser("list", help="names, roles and expiry of the scoped tokens (never the tokens)")
    revoke = sub.add_parser("revoke", help="revoke a scoped token by name (takes effect at once)")
    revoke.add_argument("name")
    for p in (create, sub.choices["list"], revoke):
        p.add_argument("--api", help="API URL (default $POLAR_API_URL, else http://127.0.0.1:8700)")
        p.add_argument("--token", help="the admin token (default $POLAR_API_TOKEN, else $POLAR_HOME/token)")
        p.add_argument("--redis", help="write Redis directly instead of asking the API")
        p.add_argument("--json", action="store_true", help="print JSON")


def _when(ts: Any) -> str:
    return "never" if ts is None else time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(float(ts)))


def run(args: argparse.Namespace) -> int:
    """Dispatch `token create|list|revoke`; returns the exit code."""
    from polar_mq.client import ApiError, Client

    cmd = args.token_command
    try:
        if args.redis:
            from polar_mq.api.roles import TokenError, TokenStore
            from polar_mq.store.core import connect

            store = TokenStore(connect(args.redis))
            try:
                if cmd == "create":
                    name, token, expires_at = store.create(args.role, args.name, args.ttl)
                    out: Any = {"name": name, "role": args.role, "token": token, "expires_at": expires_at}
                elif cmd == "list":
                    out = {"tokens": store.list()}
                else:
                    if not store.revoke(args.name):
                        print(f"error: no token named {args.name!r}", file=sys.stderr)
                        return 1
                    out = {"name": args.name, "revoked": True}
            except TokenError as exc:
                print(f"error: {exc}", file=sys.stderr)
                return 2
        else:
            client = Client(url=args.api, token=args.token)
            if cmd == "create":
                body: dict[str, Any] = {"role": args.role}
                if args.name:
                    body["name"] = args.name
                if args.ttl is not None:
                    body["ttl_seconds"] = args.ttl
                out = client._request("POST", "/v1/admin/tokens", json=body)
            elif cmd == "list":
                out = client._request("GET", "/v1/admin/tokens")
            else:
                out = client._request("DELETE", f"/v1/admin/tokens/{args.name}")
    except ApiError as exc:
        print(f"error: {exc.status} {exc.detail}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(out))
    elif cmd == "create":
        print(out["token"])
        print(f"polar-mq token: {out['name']} (role {out['role']}, expires {_when(out['expires_at'])}); "
              f"the token is shown only now", file=sys.stderr)
    elif cmd == "list":
        print(f"{'NAME':<24} {'ROLE':<7} EXPIRES")
        for t in out["tokens"]:
            print(f"{t['name']:<24} {t['role']:<7} {_when(t['expires_at'])}")
    else:
        print(f"revoked {args.name}")
    return 0
