"""Run the rollout API: gunicorn (gthread) in production, werkzeug's threaded server with --dev."""

from __future__ import annotations

import multiprocessing
from typing import Any

from ..settings import PipelineSettings


def serve(settings: PipelineSettings, *, host: str = "127.0.0.1", port: int = 8700, dev: bool = False,
          workers: int | None = None, threads: int = 16) -> None:
    from .app import create_app

    if dev:
        app = create_app(settings)
        print(f"polar_mq api (dev server) on http://{host}:{port}", flush=True)
        app.run(host=host, port=port, threaded=True, use_reloader=False)
        return

    from gunicorn.app.base import BaseApplication

    class ApiApp(BaseApplication):
        def __init__(self) -> None:
            self.options: dict[str, Any] = {
                "bind": f"{host}:{port}",
                "workers": workers or max(2, min(4, multiprocessing.cpu_count())),
                "worker_class": "gthread",
                "threads": threads,
                # /v1/admin/pause may wait for in-flight generations (settings.pause_wait).
                "timeout": max(120, int(settings.pause_wait) + 30),
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

    print(f"polar_mq api on http://{host}:{port}", flush=True)
    ApiApp().run()
