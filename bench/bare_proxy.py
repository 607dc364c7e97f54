"""The floor under any Python gateway on this box: a gevent process that forwards a request's
bytes to the upstream over a kept-alive connection and the answer's bytes back, and nothing
else (no JSON, no translation, no record), optionally with Redis I/O per call:
  * `--redis URL` (`--redis-mode trips`): two round trips, one small script before the upstream
    request and one RPUSH after it, each answered before going on;
  * `--redis-mode gateway`: the gateway's own Redis I/O and its order (core.Gateway, admission.py,
    fastpath.ThenStore): an admission script that registers the call in flight and reads the pause
    state, answered before the upstream request; then the record's MULTI (a chunk HSETNX, the
    answer RPUSHed, the call out of flight) sent before the reply, its answer read after the
    reply went out. What is left between this floor and the gateway is the gateway's own work
    (parsing, translation, the record's encoding) and nothing the contract could drop.

bench_gateway.py runs it as a reference series next to the gateway, so that the gateway's
overhead can be read against what the extra hop itself costs on the same box in the same run.
Not a product: it takes only what the bench sends (HTTP/1.1, Content-Length bodies, answers
with a Content-Length).

    python bench/bare_proxy.py --port P --upstream http://127.0.0.1:U [--redis redis://...]
"""

from __future__ import annotations

from gevent import monkey

monkey.patch_all()

import argparse  # noqa: E402
import re  # noqa: E402
import socket  # noqa: E402
from urllib.parse import urlparse  # noqa: E402

from gevent.server import StreamServer  # noqa: E402

LENGTH = re.compile(rb"\r\ncontent-length:\s*(\d+)", re.I)


def resp(*args: bytes) -> bytes:
    """One Redis command in RESP."""
    return b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args)


ADMIT = resp(b"EVAL", b"return redis.call('INCR', 'bare-proxy:n')", b"0")
# --redis-mode gateway: the admission script's shape (in flight per session and per gateway, the
# pause read) and the record's MULTI (admission.leave's exit in the same transaction).
GATEWAY_ADMIT = resp(b"EVAL", b"redis.call('HSET', KEYS[1], ARGV[1], ARGV[2]) "
                     b"redis.call('HINCRBY', KEYS[2], ARGV[3], 1) "
                     b"return {1, redis.call('GET', KEYS[3]) or 0}",
                     b"3", b"bare-proxy:inflight", b"bare-proxy:gw-inflight", b"bare-proxy:pause",
                     b"call", b"0", b"gw")
GATEWAY_LEAVE = (resp(b"HDEL", b"bare-proxy:inflight", b"call")
                 + resp(b"HINCRBY", b"bare-proxy:gw-inflight", b"gw", b"-1") + resp(b"EXEC"))


def read_message(sock: socket.socket, buf: bytes) -> tuple[bytes, bytes] | None:
    """(one whole message with a Content-Length body, the bytes after it) or None at EOF."""
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(65536)
        if not chunk:
            return None
        buf += chunk
    head_end = buf.index(b"\r\n\r\n") + 4
    match = LENGTH.search(buf, 0, head_end)
    total = head_end + (int(match.group(1)) if match else 0)
    while len(buf) < total:
        chunk = sock.recv(65536)
        if not chunk:
            return None
        buf += chunk
    return buf[:total], buf[total:]


def redis_reply(sock: socket.socket, lines: int = 1) -> None:
    """Read a reply of `lines` CRLF-ended lines (the bench's replies are short)."""
    data = b""
    while data.count(b"\r\n") < lines:
        chunk = sock.recv(65536)
        if not chunk:
            raise RuntimeError("redis closed the connection")
        data += chunk
    if data[:1] == b"-" or b"\r\n-" in data:
        raise RuntimeError(f"redis: {data!r}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--upstream", required=True)
    ap.add_argument("--redis")
    ap.add_argument("--redis-mode", choices=("trips", "gateway"), default="trips")
    args = ap.parse_args()
    gateway_io = args.redis_mode == "gateway"
    up = urlparse(args.upstream)
    rd = urlparse(args.redis) if args.redis else None

    def handle(client: socket.socket, _addr: object) -> None:
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        upstream = socket.create_connection((up.hostname, up.port))
        upstream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        store = socket.create_connection((rd.hostname, rd.port or 6379)) if rd else None
        buf, ubuf = b"", b""
        try:
            while True:
                got = read_message(client, buf)
                if got is None:
                    return
                request, buf = got
                if request.startswith(b"GET"):  # the bench's readiness probe
                    client.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                    continue
                if store is not None:
                    store.sendall(GATEWAY_ADMIT if gateway_io else ADMIT)
                    redis_reply(store, 3 if gateway_io else 1)  # *2 :1 :pause, or :n
                upstream.sendall(request)
                answer = read_message(upstream, ubuf)
                if answer is None:
                    return
                reply, ubuf = answer
                if store is None:
                    client.sendall(reply)
                    continue
                body = reply[reply.index(b"\r\n\r\n") + 4:]
                if gateway_io:
                    store.sendall(resp(b"MULTI") + resp(b"HSETNX", b"bare-proxy:chunks", b"c", body[:256])
                                  + resp(b"RPUSH", b"bare-proxy:answers", body) + GATEWAY_LEAVE)
                    client.sendall(reply)
                    redis_reply(store, 10)  # +OK, 4 +QUEUED, then EXEC: *4 and 4 integers
                    continue
                store.sendall(resp(b"RPUSH", b"bare-proxy:answers", body))
                redis_reply(store)
                client.sendall(reply)
        finally:
            upstream.close()
            if store is not None:
                store.close()

    StreamServer(("127.0.0.1", args.port), handle).serve_forever()


if __name__ == "__main__":
    main()
