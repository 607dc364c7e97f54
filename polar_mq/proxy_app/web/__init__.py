"""The gateway's HTTP layer: the WSGI fast path for provider calls (`fastpath`), the Flask app for
the rest (`app`), the gunicorn worker (`lean_worker`), serving (`serve`), the sessions resources
and metrics. The gateway itself (`proxy_app.core`) knows no HTTP framework."""
