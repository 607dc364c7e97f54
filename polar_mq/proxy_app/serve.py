"""Run the gateway: gunicorn (gthread) in production, werkzeug's threaded server with --dev."""

from __future__ import annotations

import logging
import multiprocessing
from typing import Any

from ..settings import GatewaySettings

log = logging.getLogger("polar_mq.gateway")


def serve(settings: GatewaySettings, *, dev: bool = False, workers: int | None = None,
          threads: int = 64) -> None:
    from .app import create_app

    if dev:
        app = create_app(settings)
        print(f"polar_mq gateway (dev server) on {settings.base_url}", flush=True)
        app.run(host=settings.host, port=settings.port, threaded=True, use_reloader=False)
        return

    from gunicorn.app.base import BaseApplication

    class GatewayApp(BaseApplication):
        def __init__(self) -> None:
            self.options: dict[str, Any] = {
                "bind": f"{settings.host}:{settings.port}",
                "workers": workers or max(2, min(4, multiprocessing.cpu_count())),
                "worker_class": "gthread",
                "threads": threads,
                # gthread keeps long requests (agent generations run for minutes) in threads; the
                # worker timeout only guards a stuck worker loop.
                "timeout": 120,
                "graceful_timeout": 30,
                "keepalive": 75,
                "accesslog": None,
                "loglevel": "warning",
            }
            super().__init__()

        def load_config(self) -> None:
            for key, value in self.options.items():
                self.cfg.set(key, value)

        def load(self):
            return create_app(settings)

    print(f"polar_mq gateway on {settings.base_url}", flush=True)
    GatewayApp().run()
