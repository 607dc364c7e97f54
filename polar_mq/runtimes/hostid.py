"""Which host a runtime lives on: handles are stamped with the node that started them.

A process group id, a sandbox directory or a container name means something only on the host
that made it (hosts may even share a pid space, e.g. network namespaces on one machine). Stages
check `is_here` before they signal, reap or tear down a runtime, and route a session's run and
postrun to the runtime's node (polar_mq/tasks/routing.py).
"""

from __future__ import annotations

from typing import Any

HOST_FIELD = "host"


def stamp(handle: dict[str, Any], node: str) -> dict[str, Any]:
    """The handle with the node that holds it."""
    return {**handle, HOST_FIELD: node}


def runtime_host(handle: dict[str, Any] | None) -> str | None:
    return (handle or {}).get(HOST_FIELD)


def is_here(handle: dict[str, Any] | None, node: str) -> bool:
    """True when this node may signal or tear down the runtime. Handles from before host stamps
    (no host field) belong to the single machine they were made on, i.e. here."""
    host = runtime_host(handle)
    return host is None or host == node
