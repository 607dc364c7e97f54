"""The check `polar-mq up` makes before it starts anything: which of the ports it will bind are
taken, and by what.

Without it, an `up` on taken ports would start everything, find another deployment's services
answering its health checks, say it is up, and only then die of the API's bind error. Checked
before anything starts, one message names the port and, when this user may see it, the process
holding it. Guarded by tests/cli/test_cli_newcomer.py.
"""

from __future__ import annotations

import errno
import os
import socket
from pathlib import Path

LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp's `st` column


def is_taken(host: str, port: int) -> bool:
    """True when binding (host, port) fails with EADDRINUSE. SO_REUSEADDR as gunicorn and werkzeug
    set it, so connections in TIME_WAIT left by a stopped deployment do not count as taken."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return True
            raise
    return False


def _listening_inodes(port: int) -> set[str]:
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 9 and fields[3] == LISTEN and int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(fields[9])
    return inodes


def holder(port: int) -> str | None:
    """'pid N (command line)' of a process listening on `port`, when /proc lets this user see it
    (its own processes; every process as root); else None."""
    inodes = {f"socket:[{i}]" for i in _listening_inodes(port)}
    if not inodes:
        return None
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
            if not any(os.readlink(f"/proc/{pid}/fd/{fd}") in inodes for fd in fds):
                continue
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        return f"pid {pid} ({cmd.strip()[:160]})"
    return None


def taken(host: str, ports: dict[str, int]) -> list[str]:
    """One line per port in `ports` ({role: port}) that cannot be bound on `host`."""
    problems = []
    for role, port in ports.items():
        if port and is_taken(host, port):
            who = holder(port)
            problems.append(f"port {port} ({role}) on {host} is taken"
                            + (f" by {who}" if who else " (by a process this user cannot see)"))
    return problems

