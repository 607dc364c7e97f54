"""Primitives that import nothing from polar_mq: gevent-aware locks and sends, idle sockets, the
token-id byte arrays, edge JSON checks, plug-in loading, work-dir cleanup, gunicorn serving."""
