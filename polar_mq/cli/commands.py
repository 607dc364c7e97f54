"""`polar-mq` command line: one sub-command per role (gateway, model-server, demo, harness)."""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Callable

from polar_mq.cli.common import (STAGES, STAGE_CONCURRENCY, redact_url, redis_credentials_ok, service_token,  # noqa: F401
                                 worker_defaults)


def _gateway(args: argparse.Namespace) -> int:
    from polar_mq.settings import GatewaySettings

    settings = GatewaySettings.from_env(host=args.host, port=args.port, served_model=args.served_model,
                                        public_url=args.public_url, tito=args.tito,
                                        tokenizer=args.tokenizer, worker_class=args.worker_class,
                                        lean_http=False if args.no_lean_http else None)
    if not args.dev:  # gevent workers: patch before redis, requests and ssl are imported
        from polar_mq.proxy_app.web.serve import patch_for

        try:
            patch_for(settings.worker_class)
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    from polar_mq.cli.embedded_redis import ensure_redis
    from polar_mq.proxy_app.web.serve import serve

    upstreams = args.upstream or []
    if upstreams:
        settings.upstreams = upstreams
    if not settings.upstreams:
        print("error: give at least one --upstream URL (or set POLAR_UPSTREAMS)", file=sys.stderr)
        return 2
    if settings.tito == "on" and not settings.tokenizer:
        print("error: --tito on needs --tokenizer PATH (the served model's tokenizer directory)",
              file=sys.stderr)
        return 2
    settings.admin_token = service_token("gateway", dev=args.dev)
    settings.redis_url, embedded = ensure_redis(args.redis or settings.redis_url)
    if embedded:
        print(f"started embedded redis at {redact_url(settings.redis_url)}", flush=True)
    elif not redis_credentials_ok(settings.redis_url, "gateway"):
        return 2
    serve(settings, dev=args.dev, workers=args.workers)
    return 0



def _token(args: argparse.Namespace) -> int:
    """Print the token clients send (creating $POLAR_HOME/token when there is none)."""
    from polar_mq import auth as tokens
    from polar_mq.settings import TokenSettings

    if getattr(args, "token_command", None):
        from polar_mq.cli.tokens import run

        return run(args)
    settings = TokenSettings.from_env()
    if args.path:
        print(settings.token_file)
        return 0
    print(tokens.server_token("api", settings))
    return 0


def _model_server(args: argparse.Namespace) -> int:
    from polar_mq.dev.model_server.__main__ import main as model_server_main

    return model_server_main(args.rest)




def _worker(args: argparse.Namespace) -> int:
    import os

    import sys

    from polar_mq.cli import slots

    env = {**os.environ, **({f"POLAR_{args.stage.upper()}_POOL": args.pool} if args.pool else {})}
    pool, sized, why = slots.sizing(args.stage, env)
    concurrency = args.concurrency or sized
    loglevel = args.loglevel or os.environ.get("POLAR_LOG_LEVEL") or "INFO"
    print(f"polar-mq worker: stage {args.stage}, pool {pool}, {concurrency} slots "
          f"({'--concurrency' if args.concurrency else why})", file=sys.stderr, flush=True)
    if pool in slots.THREADED_POOLS:
        before, after = slots.raise_fd_limit(int(concurrency))
        if after < 256 + slots.FDS_PER_SLOT * int(concurrency):
            print(f"polar-mq worker: the open-files limit ({after}) is low for {concurrency} slots in one "
                  "process: raise `ulimit -n` or lower --concurrency", file=sys.stderr, flush=True)
    if args.redis:
        os.environ["POLAR_REDIS_URL"] = args.redis
    if args.gateway:
        os.environ["POLAR_GATEWAY_URL"] = args.gateway
    if args.node:
        os.environ["POLAR_NODE"] = args.node
    from polar_mq.tasks.app.routing import worker_queues
    from polar_mq.tasks.worker.main import app, settings

    if not redis_credentials_ok(settings.redis_url, "worker"):
        return 2

    queues = ",".join(worker_queues(args.stage, settings.node))  # shared + this node's (routing.py)
    argv = ["worker", "-Q", queues, "-c", str(concurrency), *(["-E"] if settings.task_events else []),
            "-l", str(loglevel), "-n", f"{args.stage}-{os.getpid()}@{settings.node}", "--without-gossip",
            "--without-mingle"]
    argv += ["-P", pool]
    app.worker_main(argv)
    return 0


def _up(args: argparse.Namespace) -> int:
    from polar_mq.cli.up import PortsTaken, main as up_main

    try:
        return up_main(args)
    except PortsTaken as exc:  # raised before anything started (tests/cli/test_cli_newcomer.py)
        print(f"polar-mq up: {exc}; nothing was started (choose others with --api-port, "
              f"--gateway-port, --flower-port)", file=sys.stderr, flush=True)
        return 1


def _demo(args: argparse.Namespace) -> int:
    from polar_mq.cli.demo import main as demo_main

    return demo_main(keep=args.keep, ask_keep=args.ask_keep, harness=args.harness)


def _harness(args: argparse.Namespace) -> int:
    from polar_mq.harnesses.install import main as install_main

    return install_main(args.rest)


def _gc(args: argparse.Namespace) -> int:
    import json

    from polar_mq.store import retention
    from polar_mq.settings import PipelineSettings
    from polar_mq.store.core import Keys, connect

    settings = PipelineSettings.from_env(redis_url=args.redis, gateway_redis_url=args.gateway_redis)
    r = connect(settings.redis_url)
    gw = connect(settings.gateway_redis_url) if settings.gateway_redis_url not in (None, settings.redis_url) else None
    report = retention.gc(r, Keys(), older_than=args.older_than,
                          retention=args.retention if args.retention is not None else settings.retention_seconds,
                          delete=args.delete, sessions_dir=settings.sessions_dir, dry_run=args.dry_run, gw=gw)
    # orphan gateway sessions idle longer than --older-than: the janitor's step, by hand
    indexed = 0 if args.dry_run else retention.index_gateway_sessions(gw if gw is not None else r, Keys())
    sessions, nkeys = retention.collect_orphan_sessions(
        r, Keys(), idle=args.older_than, gw=gw, dry_run=args.dry_run, limit=1_000_000,
        ttl=0 if args.delete else (args.retention if args.retention is not None else settings.retention_seconds))
    print(json.dumps({**report.to_dict(), "orphan_sessions": len(sessions), "orphan_keys": nkeys,
                      "sessions_indexed": indexed, "dry_run": args.dry_run}))
    return 0


# The agent CLIs `polar-mq demo --harness` runs: harnesses/install.py's pinned packages, named here
# so that parsing a command line does not import the harness registry (tests/cli/test_cli_newcomer.py).
DEMO_HARNESSES = ("claude_code", "codex", "gemini_cli", "qwen_code", "opencode", "pi")


# Sub-commands whose arguments belong to another module's own parser: everything after the name
# goes there untouched (argparse's REMAINDER refuses a first argument that looks like an option,
# so `polar-mq model-server --port 8000` and `--help` failed). Guarded by tests/cli/test_cli_newcomer.py.
PASS_THROUGH: dict[str, Callable[[argparse.Namespace], int]] = {"model-server": _model_server,
                                                                "harness": _harness}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="polar-mq", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="command", required=True)

    gw = sub.add_parser("gateway", help="run the gateway proxy")
    gw.add_argument("--upstream", action="append", help="vLLM server root (repeatable)")
    gw.add_argument("--redis", help="Redis URL (default $POLAR_REDIS_URL, else an embedded Redis)")
    gw.add_argument("--host", default="127.0.0.1")
    gw.add_argument("--port", type=int, default=8600)
    gw.add_argument("--served-model", help="model name sent upstream (default: ask /v1/models)")
    gw.add_argument("--public-url", help="base URL handed to harnesses (default http://HOST:PORT)")
    gw.add_argument("--workers", type=int, help="gunicorn worker processes")
    gw.add_argument("--worker-class", choices=["gevent", "gthread"],
                    help="gunicorn worker model (default gevent: thousands of open streams per "
                         "process; $POLAR_GATEWAY_WORKER)")
    gw.add_argument("--no-lean-http", action="store_true",
                    help="serve every request through gunicorn's HTTP handling (default: gevent workers "
                         "serve plain provider calls on their lean path; $POLAR_GATEWAY_LEAN_HTTP=0)")
    gw.add_argument("--tito", choices=["auto", "on", "off"],
                    help="token-in continuation (default auto: on when --tokenizer is given and the "
                         "upstream takes token-id prompts; $POLAR_TITO)")
    gw.add_argument("--tokenizer", help="the served model's tokenizer directory, for --tito "
                                        "($POLAR_TOKENIZER)")
    gw.add_argument("--dev", action="store_true",
                    help="werkzeug threaded server instead of gunicorn; /sessions open unless a token is set")
    gw.set_defaults(func=_gateway)

    ms = sub.add_parser("model-server", help="run the vLLM-compatible stand-in model server",
                        add_help=False)
    ms.add_argument("rest", nargs=argparse.REMAINDER)
    ms.set_defaults(func=_model_server)

    wk = sub.add_parser("worker", help="run a Celery worker pool for one stage")
    wk.add_argument("--stage", required=True, choices=STAGES)
    wk.add_argument("--concurrency", type=int,
                    help="slots (run: = sessions at once; default $POLAR_<STAGE>_CONCURRENCY, else "
                         "sized from the host's cores and memory: docs/deployment.md)")
    wk.add_argument("--pool", help="celery pool (default $POLAR_<STAGE>_POOL or $POLAR_CELERY_POOL, else "
                                   "threads: many sessions per process; prefork: a process per slot)")
    wk.add_argument("--redis", help="Redis URL (default $POLAR_REDIS_URL)")
    wk.add_argument("--gateway", help="gateway URL (default $POLAR_GATEWAY_URL)")
    wk.add_argument("--node", help="this host's name in the cluster (default $POLAR_NODE, else the hostname)")
    wk.add_argument("--loglevel", help="default $POLAR_LOG_LEVEL, else INFO")
    wk.set_defaults(func=_worker)

    up = sub.add_parser("up", help="run every role on this machine (API, gateway, pools, Flower)")
    up.add_argument("--upstream", action="append", help="vLLM root URL (default: the stand-in)")
    up.add_argument("--redis", help="Redis URL (default $POLAR_REDIS_URL, else embedded)")
    up.add_argument("--host", default="127.0.0.1")
    up.add_argument("--api-port", type=int, default=8700)
    up.add_argument("--gateway-port", type=int, default=8600)
    up.add_argument("--flower-port", type=int, default=5555)
    for stage, n in STAGE_CONCURRENCY.items():
        up.add_argument(f"--{stage}-concurrency", type=int, default=None,
                        help=f"{stage} slots (default: sized from the host; prefork {n})")
    up.add_argument("--no-flower", action="store_true")
    up.add_argument("--fresh", action="store_true",
                    help="delete the embedded Redis's data ($POLAR_HOME/redis) first: a clean start")
    up.add_argument("--dev", action="store_true", help="no tokens: every service open (local development only)")
    up.set_defaults(func=_up)

    gc = sub.add_parser("gc", help="expire finished tasks' Redis data and orphan gateway sessions, prune "
                        "their session dirs (the janitor does this on its own: POLAR_RETENTION_SECONDS)")
    gc.add_argument("--redis", help="Redis URL (default $POLAR_REDIS_URL)")
    gc.add_argument("--gateway-redis", metavar="URL",
                    help="the gateway's Redis when it has its own (default $POLAR_GATEWAY_REDIS_URL)")
    gc.add_argument("--older-than", type=float, default=86400.0, metavar="SECONDS",
                    help="finished tasks created longer ago than this (default 1 day), and gateway sessions "
                    "of no task idle that long, get their TTL")
    gc.add_argument("--retention", type=float, metavar="SECONDS",
                    help="the TTL to give them (default $POLAR_RETENTION_SECONDS, 7 days)")
    gc.add_argument("--delete", action="store_true", help="delete those tasks now instead of expiring them")
    gc.add_argument("--dry-run", action="store_true", help="only report what would be done")
    gc.set_defaults(func=_gc)
    tok = sub.add_parser("token", help="print the service token (creates $POLAR_HOME/token, mode 0600, if missing)")
    tok.add_argument("--path", action="store_true", help="print where the token file is instead")
    tok.set_defaults(func=_token)
    from polar_mq.cli.tokens import add_subcommands
    add_subcommands(tok)  # create | list | revoke: scoped tokens (roles.py)

    demo = sub.add_parser("demo", help="run the end-to-end demo on embedded defaults")
    demo.add_argument("--keep", action="store_true",
                      help="leave everything running afterwards and print a viewer link that signs "
                           "the browser in; Ctrl-C stops it")
    demo.add_argument("--ask-keep", action="store_true",
                      help="ask at the end whether to keep it running (only when stdin is a terminal)")
    demo.add_argument("--harness", choices=DEMO_HARNESSES,
                      help="also run this agent CLI for real against the stand-in (installed on demand)")
    demo.set_defaults(func=_demo)

    harness = sub.add_parser("harness", help="manage harness CLIs (install NAME...)", add_help=False)
    harness.add_argument("rest", nargs=argparse.REMAINDER)
    harness.set_defaults(func=_harness)
    from polar_mq.cli.top import add_command as add_top
    add_top(sub)
    from polar_mq.cli.redis_acl import add_command as add_redis_acl
    add_redis_acl(sub)
    from polar_mq.cli.image import add_command as add_image
    add_image(sub)
    from polar_mq.deploy.slurm import add_command as add_deploy
    add_deploy(sub)
    from polar_mq.cli import client_commands as client_cli
    client_cli.add_commands(sub)
    return parser


def _pass_through(argv: list[str]) -> argparse.Namespace | None:
    """`[-v] model-server|harness ARGS...` → a namespace with `rest` = ARGS, else None."""
    lead = 0
    while lead < len(argv) and argv[lead] in ("-v", "--verbose"):
        lead += 1
    if lead < len(argv) and argv[lead] in PASS_THROUGH:
        return argparse.Namespace(verbose=lead > 0, command=argv[lead], rest=argv[lead + 1:],
                                  func=PASS_THROUGH[argv[lead]])
    return None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = _pass_through(argv) or build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("httpx", "httpx2", "urllib3", "google_genai"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    func: Callable[[argparse.Namespace], int] = args.func
    return func(args)


if __name__ == "__main__":
    sys.exit(main())
