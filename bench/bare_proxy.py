"""The floor under any Python gateway on this box: a gevent process that forwards a request's
bytes to the upstream over a kept-alive connection and the answer's bytes back, and nothing
else (no JSON, no translation, no record), optionally with two Redis round trips per call (what
the gateway's admission and record cost at least: one small script before, one RPUSH after).

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


def redis_reply(sock: socket.socket) -> None:
    data = sock.recv(65536)  # the bench's replies are one short line
    if not data or data[:1] == b"-":
        raise RuntimeError(f"redis: {data!r}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--upstream", required=True)
    ap.add_argument("--redis")
    args = ap.parse_args()
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
                    store.sendall(ADMIT)
                    redis_reply(store)
                upstream.sendall(request)
                answer = read_message(upstream, ubuf)
                if answer is None:
                    return
                reply, ubuf = answer
                if store is not None:
                    body = reply[reply.index(b"\r\n\r\n") + 4:]
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
