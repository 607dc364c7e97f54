"""The gateway's per-call Redis commands straight on redis-py connections held here.

Why: every generation makes two round trips (admission.py: one script in, one MULTI out). Through
`redis.Redis` each one also paid the client's pool and retry layers: a fork check, the blocking
pool's queue and its connection-count metrics, a readability poll of the socket before each use
(under gevent a full `select.poll` object per command), the Retry wrapper and the deprecation
decorator around `get_connection`. py-spy --gil of the small-chat path (bench/bench_gateway.py)
put those layers at ~11% of the gateway worker's CPU, more than the commands' own parsing.

`RedisWire` keeps its own LIFO list of redis-py `Connection` objects (made by the client's pool
class with the client's settings: URL, password, db, TLS, timeouts are unchanged; replies are
parsed by the same parser, hiredis when installed) and runs a command or a MULTI/EXEC on one of
them. Before an idle connection is reused it is checked with one non-blocking peek
(idle_socket.py; a closed one — Redis restarted — is replaced, so a command is never sent down a dead socket); a
connection that fails mid-command is dropped, and the error (redis.ConnectionError /
TimeoutError) reaches the caller exactly as through the client. At most `max_connections` are in
use at once (callers wait for one: the gateway's thousand streams must not open a thousand
Redis connections at once).
"""

from __future__ import annotations

import os
import threading
from typing import Any, Sequence

import redis
from redis.exceptions import NoScriptError, ResponseError

from .idle_socket import idle_and_open

Command = tuple[Any, ...]


def bounded_semaphore(n: int) -> Any:
    """gevent's own (compiled) semaphore in a monkey-patched process, else threading's. The stdlib
    one is Python code over a Condition: under gevent its release alone (notify, _is_owned, two
    lock round trips) was ~3% of a small call's CPU (py-spy --gil)."""
    try:
        from gevent import monkey
    except ImportError:
        return threading.BoundedSemaphore(n)
    if not monkey.is_module_patched("threading"):
        return threading.BoundedSemaphore(n)
    from gevent.lock import BoundedSemaphore
    return BoundedSemaphore(n)


class RedisWire:
    """Commands and transactions on connections of `client`'s kind, without its pool layers."""

    def __init__(self, client: redis.Redis, max_connections: int = 256):
        pool = client.connection_pool
        self._make = lambda: pool.connection_class(**pool.connection_kwargs)
        self._idle: list[Any] = []
        self._lock = threading.Lock()
        self._slots = bounded_semaphore(max_connections)
        self._pid = os.getpid()

    def _take(self) -> Any:
        with self._lock:
            if self._pid != os.getpid():  # forked: the parent's sockets are not ours to use
                self._idle, self._pid = [], os.getpid()
            while self._idle:
                conn = self._idle.pop()
                if idle_and_open(getattr(conn, "_sock", None)):
                    return conn
                conn.disconnect()
        conn = self._make()
        conn.connect()
        return conn

    def _give_back(self, conn: Any) -> None:
        with self._lock:
            self._idle.append(conn)

    def _run(self, commands: Sequence[Command], replies: int) -> list[Any]:
        """Send `commands` in one write and read `replies` replies (a ResponseError reply is
        returned in place, not raised: the caller decides)."""
        self._slots.acquire()
        try:
            conn = self._take()
            try:
                conn.send_packed_command(conn.pack_commands(commands), check_health=False)
                out: list[Any] = []
                for _ in range(replies):
                    try:
                        out.append(conn.read_response())
                    except ResponseError as exc:
                        out.append(exc)
            except BaseException:
                conn.disconnect()
                raise
            self._give_back(conn)
            return out
        finally:
            self._slots.release()

    def execute(self, *args: Any) -> Any:
        """One command; a Redis error reply raises ResponseError as redis-py does."""
        reply = self._run([args], 1)[0]
        if isinstance(reply, ResponseError):
            raise reply
        return reply

    def evalsha(self, sha: str, script: str, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        """A script by its digest, loaded (EVAL) when this Redis does not know it yet."""
        try:
            return self.execute("EVALSHA", sha, len(keys), *keys, *args)
        except NoScriptError:
            pass
        return self.execute("EVAL", script, len(keys), *keys, *args)

    def transaction(self, commands: Sequence[Command]) -> list[Any]:
        """MULTI, the commands, EXEC in one round trip; EXEC's replies (an error reply of one
        command comes back in its place, as a redis-py pipeline with raise_on_error=False)."""
        wire: list[Command] = [("MULTI",), *commands, ("EXEC",)]
        replies = self._run(wire, len(wire))
        for reply in replies[:-1]:  # +OK / +QUEUED, or an error that aborts the EXEC
            if isinstance(reply, ResponseError):
                raise reply
        result = replies[-1]
        if isinstance(result, ResponseError):
            raise result
        if result is None:
            raise redis.exceptions.WatchError("transaction aborted")
        return list(result)
