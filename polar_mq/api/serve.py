"""Run the rollout API (gunicorn gthread; werkzeug with --dev)."""

from __future__ import annotations

from polar_mq._io.serving import serve_wsgi
from polar_mq.settings import PipelineSettings


def serve(settings: PipelineSettings, *, host: str = "127.0.0.1", port: int = 8700, dev: bool = False,
          workers: int | None = None, threads: int = 16) -> None:
    from polar_mq.api.app import create_app

    # /v1/admin/pause may wait for in-flight generations (settings.pause_wait).
    serve_wsgi("api", lambda: create_app(settings), host=host, port=port, dev=dev, workers=workers,
               threads=threads, timeout=max(120, int(settings.pause_wait) + 30))
