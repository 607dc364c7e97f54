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

A gateway on *another host* (a cluster: ``--public-url http://hub:8600``) is forwarded the same
way without giving the sandbox the host's network: the sandbox listens on ``127.0.0.1:PORT`` and
the worker host relays to ``hub:PORT`` (:func:`sandbox_forwards`); the harness is handed the
loopback URLs (:func:`sandbox_urls`). Only the gateway is reachable, nothing else on that host.

Tests: tests/pipeline/test_netbridge_remote.py, tests/trust/test_trust_sandbox.py.
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
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable
from urllib.parse import urlsplit, urlunsplit

from polar_mq.runtimes.session_guard import guarded_relay

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


@dataclass(frozen=True)
class Forward:
    """Inside the sandbox listen on listen_host:port; outside connect to target_host:target_port."""

    listen_host: str
    port: int
    target_host: str
    target_port: int


def sandbox_forwards(urls: Iterable[str]) -> list[Forward]:
    """A forward per distinct gateway endpoint: a loopback endpoint keeps its address (the
    harness's URLs need no change); a remote one listens on 127.0.0.1 at the same port (the next
    free port if two remote hosts share one)."""
    forwards: list[Forward] = []
    taken: set[tuple[str, int]] = set()
    for host, port in gateway_endpoints(urls):
        listen = "127.0.0.1" if host == "localhost" or not is_loopback(host) else host
        lport = port
        while (listen, lport) in taken:
            lport += 1
        taken.add((listen, lport))
        forwards.append(Forward(listen, lport, host, port))
    return forwards


def sandbox_urls(base_urls: dict[str, str]) -> dict[str, str]:
    """The base URLs as a bridged sandbox must use them (remote gateways → their loopback forward)."""
    by_target = {(f.target_host, f.target_port): f for f in sandbox_forwards(base_urls.values())}
    out = {}
    for name, url in base_urls.items():
        parts = urlsplit(url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        fw = by_target.get((parts.hostname or "", port))
        if fw is None or (fw.listen_host, fw.port) == (fw.target_host, fw.target_port):
            out[name] = url
            continue
        out[name] = urlunsplit(parts._replace(netloc=f"{fw.listen_host}:{fw.port}"))
    return out


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
    """Accept on `listener`, relay each connection to what `connect()` returns (daemon threads).
    With a `guard` (session_guard.SessionGuard) each connection carries one HTTP request, and
    only one that belongs to the guarded session."""

    def __init__(self, listener: socket.socket, connect, guard=None):
        self.listener = listener
        self.connect = connect
        self.guard = guard
        self._closed = False
        self.thread = threading.Thread(target=self._loop, name="polar-netbridge", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while not self._closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if self.guard is not None:
                client.settimeout(600)
                threading.Thread(target=guarded_relay, args=(client, self.connect, self.guard, _pipe),
                                 daemon=True).start()
            else:
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

    def __init__(self, path: Path, host: str, port: int, guard=None):
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
        super().__init__(s, tcp_connector(host, port), guard)

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
    """Listeners inside a container's network namespace for each gateway endpoint (an endpoint
    is a Forward, or a (host, port) listened on and relayed to as is)."""

    def __init__(self, pid: int, endpoints: list[Forward] | list[tuple[str, int]], guard=None):
        self.relays: list[Relay] = []
        try:
            for ep in endpoints:
                fw = ep if isinstance(ep, Forward) else Forward("127.0.0.1" if ep[0] == "localhost" else ep[0],
                                                                ep[1], ep[0], ep[1])
                self.relays.append(Relay(listen_in_netns(pid, fw.listen_host, fw.port),
                                         tcp_connector(fw.target_host, fw.target_port), guard))
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
