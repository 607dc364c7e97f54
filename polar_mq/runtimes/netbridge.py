"""Gateway access for sandboxes without a network.

A session that may not reach the internet (``runtime.allow_internet: false``) still has to reach
the gateway, which usually listens on the worker host's loopback (``http://127.0.0.1:8600``). A
private network namespace has its own loopback, so the sandbox gets a forwarder that listens on
the *same* host:port inside its namespace and relays each connection to the real gateway. The
harness's base URLs and config files stay unchanged, and nothing else is reachable.

Two ways to put a listener inside a namespace:

* ``listen_in_netns(pid, host, port)`` (docker): a worker thread enters the container's network
  namespace (``setns`` on ``/proc/PID/ns/net``), binds and listens, and returns; the socket stays
  in that namespace while the worker's accept loop relays to the gateway from the host side.
  Needs CAP_SYS_ADMIN (a root worker) on the docker host.
* ``python -m polar_mq.runtimes.netbridge --listen HOST:PORT=SOCK -- CMD...`` (bwrap): run inside
  the sandbox (the host's read-only root makes this interpreter available there); it listens on
  the sandbox loopback and relays to a unix socket in the session dir, which a host-side
  :class:`UnixRelay` relays to the gateway. Works unprivileged.
"""

from __future__ import annotations

import argparse
import ctypes
import ipaddress
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Iterable
from urllib.parse import urlsplit

log = logging.getLogger("polar_mq.netbridge")

CLONE_NEWNET = 0x40000000


def gateway_endpoints(urls: Iterable[str]) -> list[tuple[str, int]]:
    """The distinct (host, port) of the given base URLs."""
    seen: list[tuple[str, int]] = []
    for url in urls:
        parts = urlsplit(url)
        if not parts.hostname:
            continue
        ep = (parts.hostname, parts.port or (443 if parts.scheme == "https" else 80))
        if ep not in seen:
            seen.append(ep)
    return seen


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _pipe(src: socket.socket, dst: socket.socket) -> None:
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    finally:
        try:
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass


def _relay(client: socket.socket, connect) -> None:
    try:
        upstream = connect()
    except OSError as exc:
        log.warning("netbridge: cannot reach the gateway: %s", exc)
        client.close()
        return
    t = threading.Thread(target=_pipe, args=(upstream, client), daemon=True)
    t.start()
    _pipe(client, upstream)
    t.join()
    client.close()
    upstream.close()


class Relay:
    """Accept on `listener`, relay each connection to what `connect()` returns (daemon threads)."""

    def __init__(self, listener: socket.socket, connect):
        self.listener = listener
        self.connect = connect
        self._closed = False
        self.thread = threading.Thread(target=self._loop, name="polar-netbridge", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while not self._closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=_relay, args=(client, self.connect), daemon=True).start()

    def close(self) -> None:
        self._closed = True
        try:
            self.listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.listener.close()


def tcp_connector(host: str, port: int):
    return lambda: socket.create_connection((host, port), timeout=None)


def unix_connector(path: str):
    def connect() -> socket.socket:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(path)
        return s
    return connect


def _tcp_listener(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    s = socket.socket(family, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((host, port))
    s.listen(64)
    return s


class UnixRelay(Relay):
    """Host side of the bwrap bridge: a unix socket file relayed to the gateway over TCP."""

    def __init__(self, path: Path, host: str, port: int):
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            path.unlink()
        except FileNotFoundError:
            pass
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(str(path))
        os.chmod(path, 0o666)
        s.listen(64)
        self.path = path
        super().__init__(s, tcp_connector(host, port))

    def close(self) -> None:
        super().close()
        try:
            self.path.unlink()
        except OSError:
            pass


def listen_in_netns(pid: int, host: str, port: int) -> socket.socket:
    """A TCP listener on host:port inside the network namespace of process `pid` (needs
    CAP_SYS_ADMIN). setns affects only the calling thread, so a short-lived thread does it."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    result: dict = {}

    def work() -> None:
        try:
            own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
            target = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY)
            try:
                if libc.setns(target, CLONE_NEWNET) != 0:
                    err = ctypes.get_errno()
                    raise OSError(err, f"setns into the network namespace of pid {pid}: {os.strerror(err)}")
                try:
                    result["sock"] = _tcp_listener(host, port)
                finally:
                    if libc.setns(own, CLONE_NEWNET) != 0:  # pragma: no cover - never seen
                        result["fatal"] = True
            finally:
                os.close(own)
                os.close(target)
        except Exception as exc:  # noqa: BLE001 - handed to the caller
            result["error"] = exc

    t = threading.Thread(target=work, name="polar-setns")
    t.start()
    t.join()
    if "error" in result:
        raise result["error"]
    return result["sock"]


class NetnsBridge:
    """Listeners inside a container's network namespace for each gateway endpoint."""

    def __init__(self, pid: int, endpoints: list[tuple[str, int]]):
        self.relays: list[Relay] = []
        try:
            for host, port in endpoints:
                listen_host = "127.0.0.1" if host == "localhost" else host
                self.relays.append(Relay(listen_in_netns(pid, listen_host, port), tcp_connector(host, port)))
        except Exception:
            self.close()
            raise

    def close(self) -> None:
        for r in self.relays:
            r.close()
        self.relays.clear()


# ---- in-sandbox side ----------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    """``--listen HOST:PORT=UNIX_SOCKET`` (repeatable) ``-- CMD ARGS...``: relay then run CMD."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv:
        print("usage: netbridge --listen HOST:PORT=SOCK ... -- CMD ...", file=sys.stderr)
        return 2
    cut = argv.index("--")
    ap = argparse.ArgumentParser(prog="polar_mq.runtimes.netbridge")
    ap.add_argument("--listen", action="append", default=[])
    args = ap.parse_args(argv[:cut])
    cmd = argv[cut + 1:]
    relays = []
    for spec in args.listen:
        addr, _, sock_path = spec.partition("=")
        host, _, port = addr.rpartition(":")
        relays.append(Relay(_tcp_listener(host.strip("[]"), int(port)), unix_connector(sock_path)))
    proc = subprocess.Popen(cmd)

    def forward(signum, _frame):
        try:
            proc.send_signal(signum)
        except ProcessLookupError:
            pass

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, forward)
    code = proc.wait()
    for r in relays:
        r.close()
    return code if code >= 0 else 128 - code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
