"""Run the gateway: gunicorn (gevent workers by default, gthread on request); werkzeug with --dev.

Why gevent: every agent keeps one connection open for a whole generation, so a gateway host
serving ~1,000 agents holds ~1,000 streams at once; a gthread worker holds one per thread (64).
A gevent worker holds one greenlet per connection (tens of KB each) and serves keep-alive
requests inline on that greenlet, without the hand-offs between gthread's poller and its pool
(measured in bench/bench_gateway.py). The Flask app, the Redis client and the upstream client are
the same code under both: gevent's monkey-patching makes their sockets, locks, threads and
queues cooperative. Patching must come before those modules are imported (an ssl imported
unpatched breaks https upstreams), hence `patch_for` at the top of the command.
"""

from __future__ import annotations

from polar_mq.settings import GatewaySettings

WORKER_CLASSES = ("gevent", "gthread")


def patch_for(worker_class: str) -> None:
    """Monkey-patch the process for a gevent worker; call before importing the app."""
    if worker_class not in WORKER_CLASSES:
        raise ValueError(f"gateway worker class must be one of {', '.join(WORKER_CLASSES)}, "
                         f"got {worker_class!r}")
    if worker_class == "gevent":
        from gevent import monkey

        if not monkey.is_module_patched("socket"):
            monkey.patch_all()


def serve(settings: GatewaySettings, *, dev: bool = False, workers: int | None = None,
          threads: int = 64) -> None:
    from polar_mq._io.serving import serve_wsgi
    from polar_mq.proxy_app.web.metrics import prepare_multiprocess, worker_exited

    if not dev:
        patch_for(settings.worker_class)
        prepare_multiprocess()  # gunicorn workers: /metrics sums every worker process

    def factory():
        from polar_mq.proxy_app.web.app import create_app

        return create_app(settings)

    worker_class = settings.worker_class
    if worker_class == "gevent" and settings.lean_http:
        worker_class = "polar_mq.proxy_app.web.lean_worker.LeanWorker"  # gunicorn's gevent worker + lean path
    serve_wsgi("gateway", factory, host=settings.host, port=settings.port, dev=dev,
               workers=workers, threads=threads, on_child_exit=None if dev else worker_exited,
               worker_class=worker_class, worker_connections=settings.worker_connections)
