"""The one interface every store sends its commands through (`Wire`), and its two kinds, chosen
once when a store is built: `RedisWire` for the gateway's per-call commands, `PipelineWire`
(redis-py's client and pipelines) everywhere else. Stores never ask which they hold
(tests/store/test_redis_wire.py runs the same operations through both).

RedisWire: the gateway's per-call Redis commands straight on redis-py connections held here.

Why: every generation makes two round trips (admission.py: one script in, one MULTI out). Through
`redis.Redis` each one would also pay the client's pool and retry layers: a fork check, the
blocking pool's queue and its connection-count metrics, a readability poll of the socket before
each use (under gevent a full `select.poll` object per command), the Retry wrapper and the
deprecation decorator around `get_connection` — more CPU than the commands' own parsing.

`RedisWire` keeps its own LIFO list of redis-py `Connection` objects (made by the client's pool
class with the client's settings: URL, password, db, TLS, timeouts are unchanged; replies are
parsed by the same parser, hiredis when installed) and runs a command or a MULTI/EXEC on one of
them. Before an idle connection is reused it is checked with one non-blocking peek
(idle_socket.py; a closed one — Redis restarted — is replaced, so a command is never sent down a dead socket); a
connection that fails mid-command is dropped, and the error (redis.ConnectionError /
TimeoutError) reaches the caller exactly as through the client. At most `max_connections` are in
use at once (callers wait for one: the gateway's thousand streams must not open a thousand
Redis connections at once). Connections of a Sentinel-managed client (redis_url.py) ask the
Sentinels for the primary when they connect, and one that meets a demoted primary (READONLY) is
dropped and its call fails as a ConnectionError (tests/store/test_sentinel.py).
"""

from __future__ import annotations

import os
import socket
from typing import Any, Protocol, Sequence

import redis
from hiredis import pack_command  # a dependency (setup.py): redis-py's HiredisRespSerializer uses it too
from redis.connection import HiredisRespSerializer
from redis.exceptions import NoScriptError, ReadOnlyError, ResponseError
from redis.sentinel import SentinelManagedConnection

from polar_mq._io.fast_send import send_all
from polar_mq._io.idle_socket import idle_and_open
from polar_mq._io.locks import bounded_semaphore, short_lock

Command = tuple[Any, ...]


def pack_commands(conn: Any, commands: Sequence[Command]) -> bytes:
    """`commands` in RESP, one bytes object: with hiredis, each command packed by
    `hiredis.pack_command` as redis-py's HiredisRespSerializer packs it (same bytes), without
    its per-command argument copies and buffer bookkeeping; else by `conn.pack_commands`."""
    if isinstance(getattr(conn, "_command_packer", None), HiredisRespSerializer):
        try:
            # redis-py splits a command name with a space ("CONFIG GET"): names here have none
            if all(isinstance(c[0], str) and " " not in c[0] for c in commands):
                return b"".join([pack_command(c) for c in commands])
        except TypeError:
            pass  # an argument hiredis refuses: redis-py's packer converts it or says why (DataError)
    return b"".join(conn.pack_commands(commands))


def send_commands(conn: Any, commands: Sequence[Command]) -> None:
    """`conn.send_packed_command(conn.pack_commands(commands))` in one write (fast_send.send_all:
    gevent's sendall asked the kernel for the send buffer's size first, every time), with its
    errors: the connection closed, redis.TimeoutError / ConnectionError."""
    wire = pack_commands(conn, commands)
    if not conn._sock:
        conn.connect()
    try:
        send_all(conn._sock, wire)
    except socket.timeout:
        conn.disconnect()
        raise redis.TimeoutError("Timeout writing to socket") from None
    except OSError as exc:
        conn.disconnect()
        code, message = ("UNKNOWN", exc.args[0]) if len(exc.args) == 1 else exc.args[:2]
        raise redis.ConnectionError(f"Error {code} while writing to socket. {message}.") from None


def read_replies(conn: Any, n: int) -> list[Any]:
    """`n` replies from `conn`, an error reply (ResponseError) in its place: straight from the
    connection's parser (RESP2 or RESP3, push messages skipped as `read_response` skips them),
    with `Connection.read_response`'s handling of a broken read (the connection closed,
    redis.TimeoutError / ConnectionError naming the host). That wrapper formats the host's
    name for an error message before every reply, error or not."""
    out: list[Any] = []
    parser = conn._parser
    try:
        for _ in range(n):
            out.append(parser.read_response(disable_decoding=False))
    except socket.timeout:
        conn.disconnect()
        raise redis.TimeoutError(f"Timeout reading from {conn._host_error()}") from None
    except OSError as exc:
        conn.disconnect()
        raise redis.ConnectionError(f"Error while reading from {conn._host_error()} : {exc.args}") from None
    except BaseException:
        conn.disconnect()
        raise
    return out


class RedisWire:
    """Commands and transactions on connections of `client`'s kind, without its pool layers."""

    def __init__(self, client: redis.Redis, max_connections: int = 256):
        pool = client.connection_pool
        self._make = lambda: pool.connection_class(**pool.connection_kwargs)
        self._idle: list[Any] = []
        self._lock = short_lock()  # only the list: the peek and connect happen outside
        self._slots = bounded_semaphore(max_connections)
        self._pid = os.getpid()
        from polar_mq.store.replicated import wait_command

        self._wait = wait_command(client)  # Sentinel mode: a transaction waits for a replica

    def _take(self) -> Any:
        while True:
            with self._lock:
                if self._pid != os.getpid():  # forked: the parent's sockets are not ours to use
                    self._idle, self._pid = [], os.getpid()
                conn = self._idle.pop() if self._idle else None
            if conn is None:
                break
            if idle_and_open(getattr(conn, "_sock", None)):
                return conn
            conn.disconnect()
        conn = self._make()
        conn.connect()
        return conn

    def _give_back(self, conn: Any) -> None:
        with self._lock:
            self._idle.append(conn)

    def send(self, commands: Sequence[Command], replies: int) -> "Sent":
        """Write `commands` in one send and return without reading their `replies` replies
        (Sent.replies reads them; until then the connection is this caller's). Redis runs what
        it received whether or not the replies are ever read."""
        self._slots.acquire()
        try:
            conn = self._take()
            try:
                send_commands(conn, commands)
            except BaseException:
                conn.disconnect()
                raise
        except BaseException:
            self._slots.release()
            raise
        return Sent(self, conn, replies)

    def run(self, commands: Sequence[Command], replies: int | None = None) -> list[Any]:
        """Send `commands` in one write and read `replies` replies (default: one per command; a
        ResponseError reply is returned in place, not raised: the caller decides)."""
        if replies is None:
            replies = len(commands)
        return self.send(commands, replies).replies()

    def execute(self, *args: Any) -> Any:
        """One command; a Redis error reply raises ResponseError as redis-py does."""
        reply = self.run([args], 1)[0]
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
        return self.exec_replies(self.send_transaction(commands).replies())

    def send_transaction(self, commands: Sequence[Command]) -> "Sent":
        """`transaction` sent, its replies not read yet: `exec_replies(sent.replies())`."""
        wire: list[Command] = [("MULTI",), *commands, ("EXEC",)]
        if self._wait is None:
            return self.send(wire, len(wire))
        sent = self.send([*wire, self._wait], len(wire) + 1)
        sent._waited = True
        return sent

    @staticmethod
    def exec_replies(replies: list[Any]) -> list[Any]:
        """EXEC's replies out of a transaction's replies (`transaction`)."""
        for reply in replies[:-1]:  # +OK / +QUEUED, or an error that aborts the EXEC
            if isinstance(reply, ResponseError):
                raise reply
        result = replies[-1]
        if isinstance(result, ResponseError):
            raise result
        if result is None:
            raise redis.exceptions.WatchError("transaction aborted")
        return list(result)


def _demoted(reply: Any) -> bool:
    """A reply that says this connection's server is no longer the primary: a write refused
    (READONLY) or a blocked command released by the demotion (UNBLOCKED ...)."""
    return isinstance(reply, ReadOnlyError) or (
        isinstance(reply, ResponseError) and str(reply).startswith("UNBLOCKED force unblock"))


class Sent:
    """Commands a RedisWire wrote whose replies are not read yet. `replies()` reads them once
    and gives the connection back (closed when the read failed); it must follow, or the
    connection and its slot stay taken."""

    _waited = False  # the last command sent is a WAIT (replicated.py): its reply is not the caller's
    answered = False  # the replies are on the connection, to be read

    def __init__(self, wire: RedisWire, conn: Any, replies: int):
        self._wire, self._conn, self._n = wire, conn, replies

    def replies(self) -> list[Any]:
        conn, self._conn = self._conn, None
        if conn is None:
            raise RuntimeError("the replies were read already")
        try:
            out = read_replies(conn, self._n)  # a failed read closes the connection
            if isinstance(conn, SentinelManagedConnection) and any(map(_demoted, out)):
                conn.disconnect()  # the next connect asks the Sentinels for the new primary
                raise redis.ConnectionError("the primary was demoted (failover); nothing was written")
            self._wire._give_back(conn)
            if self._waited:
                from polar_mq.store.replicated import acked

                acked(out.pop(), "gateway record")
            return out
        finally:
            self._wire._slots.release()


class Replies(Protocol):
    answered: bool  # the replies are read already (replies() returns at once)

    def replies(self) -> list[Any]: ...


class Wire(Protocol):
    """What a store needs of Redis beyond its client: commands sent now and read later, in one
    round trip, and MULTI/EXEC transactions (replies in order; an error reply in its place)."""

    def send(self, commands: Sequence[Command], replies: int) -> Replies: ...

    def run(self, commands: Sequence[Command], replies: int | None = None) -> list[Any]: ...

    def execute(self, *args: Any) -> Any: ...

    def transaction(self, commands: Sequence[Command]) -> list[Any]: ...

    def send_transaction(self, commands: Sequence[Command]) -> Replies: ...


class Answered:
    """Replies already read (PipelineWire answers at once)."""

    __slots__ = ("_replies",)
    answered = True

    def __init__(self, replies: list[Any]):
        self._replies = replies

    def replies(self) -> list[Any]:
        return self._replies


class PipelineWire:
    """The `Wire` interface through redis-py's client: its pool, pipelines and retries. `send`
    runs the commands at once (the answer is kept for `replies()`); a transaction's replies are
    shaped as RedisWire's (`RedisWire.exec_replies` reads both)."""

    def __init__(self, client: redis.Redis):
        self.client = client

    def send(self, commands: Sequence[Command], replies: int) -> Answered:
        return Answered(self.run(commands, replies))

    def run(self, commands: Sequence[Command], replies: int | None = None) -> list[Any]:
        pipe = self.client.pipeline(transaction=False)
        for cmd in commands:
            pipe.execute_command(*cmd)
        return list(pipe.execute(raise_on_error=False))

    def execute(self, *args: Any) -> Any:
        return self.client.execute_command(*args)

    def transaction(self, commands: Sequence[Command]) -> list[Any]:
        pipe = self.client.pipeline(transaction=True)
        for cmd in commands:
            pipe.execute_command(*cmd)
        return list(pipe.execute(raise_on_error=False))

    def send_transaction(self, commands: Sequence[Command]) -> Answered:
        return Answered(["OK", *(["QUEUED"] * len(commands)), self.transaction(commands)])
