"""Run the gateway (gunicorn gthread; werkzeug with --dev)."""

from __future__ import annotations

from ..serving import serve_wsgi
from ..settings import GatewaySettings


def serve(settings: GatewaySettings, *, dev: bool = False, workers: int | None = None,
          threads: int = 64) -> None:
    from .app import create_app
    from .metrics import prepare_multiprocess, worker_exited

    if not dev:  # gunicorn workers: /metrics sums every worker process
        prepare_multiprocess()
    serve_wsgi("gateway", lambda: create_app(settings), host=settings.host, port=settings.port, dev=dev,
               workers=workers, threads=threads, on_child_exit=None if dev else worker_exited)
