"""Serve a Flask app: gunicorn with gthread workers in production, werkzeug's threaded server in dev.

The gateway and the rollout API share this; each passes its own app factory and limits.
"""

from __future__ import annotations

import json
import multiprocessing
from typing import Any, Callable

from flask import Flask


def problem_error(sock: Any, status_int: int, reason: str, mesg: str) -> None:
    """gunicorn's answer to a request it cannot parse (a bad Content-Length, an over-long request
    line, too many headers), written before any app sees the request: as application/problem+json,
    the API's error format, instead of gunicorn's HTML page (tests/api/test_fuzz_api.py found one)."""
    from gunicorn import util

    body = json.dumps({"type": "about:blank", "title": reason, "status": status_int, "detail": mesg}).encode()
    head = (f"HTTP/1.1 {status_int} {reason}\r\nConnection: close\r\n"
            f"Content-Type: application/problem+json\r\nContent-Length: {len(body)}\r\n\r\n")
    util.write_nonblock(sock, head.encode("latin1") + body)


def serve_wsgi(name: str, factory: Callable[[], Flask], *, host: str, port: int, dev: bool = False,
               workers: int | None = None, threads: int = 64, timeout: int = 120,
               on_child_exit: Callable[[int], None] | None = None, worker_class: str = "gthread",
               worker_connections: int = 1000) -> None:
    """`worker_class` "gevent" needs the process monkey-patched before anything else is imported
    (the caller does that: see polar_mq/proxy_app/web/serve.py)."""
    if dev:
        import logging

        from polar_mq._io.redact import RedactingFilter

        logging.getLogger("werkzeug").addFilter(RedactingFilter())  # request lines name /s/<key>
        print(f"polar_mq {name} (dev server) on http://{host}:{port}", flush=True)
        factory().run(host=host, port=port, threaded=True, use_reloader=False)
        return

    from gunicorn import util
    from gunicorn.app.base import BaseApplication

    from polar_mq._io import gunicorn_tuning

    util.write_error = problem_error  # the workers answer unparsable requests through it
    gunicorn_tuning.install()
    # Each connection a worker holds is a client socket and, for the gateway, an upstream one:
    # a soft limit of 1024 would refuse connections from ~500 concurrent calls on (fdlimit.py).
    # Raised in the master before the workers fork, so they inherit it.
    from polar_mq._io.fdlimit import raise_nofile

    held = threads if worker_class == "gthread" else worker_connections  # gevent and its subclasses
    _, fds = raise_nofile(256 + 2 * held)
    if fds < 256 + 2 * held:
        print(f"polar_mq {name}: the open-files limit ({fds}) is low for {held} connections per worker: "
              "raise `ulimit -n`", flush=True)

    class Application(BaseApplication):
        def __init__(self) -> None:
            self.options: dict[str, Any] = {
                "bind": f"{host}:{port}",
                "workers": workers or max(2, min(4, multiprocessing.cpu_count())),
                "worker_class": worker_class,
                "threads": threads,
                "worker_connections": worker_connections,
                # gthread keeps long requests in threads; this only guards a stuck worker loop.
                "timeout": timeout,
                "graceful_timeout": 30,
                "keepalive": 75,
                "accesslog": None,
                "loglevel": "warning",
            }
            # A worker whose master is gone exits at once (gracefully), not at its next
            # parent check: `polar-mq up` killed leaves nothing (supervise.py).
            self.options["post_fork"] = _follow_master
            if on_child_exit is not None:
                self.options["child_exit"] = lambda server, worker: on_child_exit(worker.pid)
            super().__init__()

        def load_config(self) -> None:
            for key, value in self.options.items():
                self.cfg.set(key, value)

        def load(self) -> Flask:
            return factory()

    print(f"polar_mq {name} on http://{host}:{port}", flush=True)
    Application().run()


def _follow_master(server: Any, worker: Any) -> None:  # noqa: ARG001  (gunicorn's hook signature)
    import signal

    from polar_mq._io.supervise import follow_parent

    follow_parent(signal.SIGTERM, worker.ppid)
