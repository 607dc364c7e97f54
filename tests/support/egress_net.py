"""An "outside" for egress tests (there is no internet here): a network namespace joined to the
host by a veth pair, with a TCP listener that greets with b"outside"; and a hub whose Redis and
API listen on every address of the host (loopback and non-loopback). Needs root (ip netns)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass

OUTSIDE_PORT = 8443
LISTENER = ("import socket\ns=socket.socket();s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n"
            "s.bind(('0.0.0.0',%d));s.listen(64)\nwhile True:\n c,_=s.accept();c.sendall(b'outside');c.close()\n")


@dataclass
class Outside:
    netns: str
    host_ip: str  # the host's end of the veth
    ip: str  # the listener's address ("the internet")
    veth: str
    proc: subprocess.Popen

    @property
    def target(self) -> str:
        return f"{self.ip}:{OUTSIDE_PORT}"

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()
        subprocess.run(["ip", "link", "del", self.veth], capture_output=True)
        subprocess.run(["ip", "netns", "del", self.netns], capture_output=True)


def sh(*args: str) -> None:
    subprocess.run(list(args), check=True, capture_output=True)


def start_outside() -> Outside:
    tag = uuid.uuid4().hex[:6]
    ns, veth = f"pmqout{tag}", f"pmqo{tag}"
    third = int(tag[:2], 16) % 200 + 20
    host_ip, ip = f"10.253.{third}.1", f"10.253.{third}.2"
    sh("ip", "netns", "add", ns)
    sh("ip", "link", "add", veth, "type", "veth", "peer", "name", f"{veth}p")
    sh("ip", "link", "set", f"{veth}p", "netns", ns)
    sh("ip", "addr", "add", f"{host_ip}/24", "dev", veth)
    sh("ip", "link", "set", veth, "up")
    sh("ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", f"{veth}p")
    sh("ip", "-n", ns, "link", "set", f"{veth}p", "up")
    sh("ip", "-n", ns, "link", "set", "lo", "up")
    sh("ip", "-n", ns, "route", "add", "default", "via", host_ip)
    proc = subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-c", LISTENER % OUTSIDE_PORT],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    out = Outside(netns=ns, host_ip=host_ip, ip=ip, veth=veth, proc=proc)
    import socket

    deadline = time.time() + 10
    while time.time() < deadline:
        try:
            with socket.create_connection((ip, OUTSIDE_PORT), 1) as s:
                if s.recv(16) == b"outside":
                    return out
        except OSError:
            time.sleep(0.1)
    out.close()
    raise RuntimeError("the outside listener did not come up")


def host_ip() -> str:
    """A non-loopback address of this host (where a hub bound to 0.0.0.0 answers)."""
    from polar_mq.runtimes.egress import host_addresses

    addrs = [a for a in host_addresses() if not a.startswith("10.253.")]
    assert addrs, "this host has no non-loopback address"
    return addrs[0]


def root_reason() -> str | None:
    if os.geteuid() != 0:
        return "needs root (network namespaces for the outside)"
    return None
