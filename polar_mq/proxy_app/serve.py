"""Run the gateway (gunicorn gthread; werkzeug with --dev)."""

from __future__ import annotations

from ..serving import serve_wsgi
from ..settings import GatewaySettings


def serve(settings: GatewaySettings, *, dev: bool = False, workers: int | None = None,
          threads: int = 64) -> None:
    from .app import create_app

    serve_wsgi("gateway", lambda: create_app(settings), host=settings.host, port=settings.port, dev=dev,
               workers=workers, threads=threads)
