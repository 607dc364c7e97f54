"""Sandbox egress: ``allow_internet: true`` reaches the internet but not the hub.

What a sandbox with internet may not reach (:func:`blocked_networks`): the hub's addresses (the
hosts of the Redis URL, Sentinels included, of the gateway URLs and of ``POLAR_API_URL``),
every address of the worker host itself (a hub on the same host, any service bound to 0.0.0.0),
link-local / cloud metadata ``169.254.0.0/16``, and the operator's ``POLAR_SANDBOX_BLOCK``
(comma-separated CIDRs or host names). Its own session's gateway stays reachable through the
netbridge forwarder (netbridge.py), which listens on the sandbox's loopback and passes only the
session's provider calls (session_guard.py).

Per runtime:

* ``bwrap``: a private network namespace with user-mode networking (:class:`SlirpNet`:
  ``slirp4netns --disable-host-loopback``; the sandbox's own loopback, NAT to the outside through
  the worker's network stack), and a ``prohibit`` route per blocked network inside that
  namespace, set from outside before the command starts (``bwrap --block-fd``); the sandbox runs
  with no capabilities (``--cap-drop ALL``), so it cannot remove them. Without slirp4netns the
  session fails with a message saying to install it (never the host network).
* ``docker``: a bridge network (``POLAR_DOCKER_EGRESS_NETWORK``, default ``polar-egress``, made
  on first use) instead of the host network, and, where the worker is root with ``iptables``, a
  chain ``POLAR-EGRESS`` hooked into INPUT and FORWARD for that bridge that rejects the blocked
  networks (the worker host itself in INPUT: the gateway arrives through the netbridge, not the
  network). Without root the bridge still hides the host's loopback; the rest is documented.
* ``apptainer``: not enforced (it shares the host network); docs/security.md says so.

``POLAR_SANDBOX_HOST_NETWORK=1`` (operator only) restores the host network for ``allow_internet``
sandboxes. Tests: tests/trust/test_trust_sandbox.py (bwrap and docker: the hub's Redis and API
ports refused on loopback and on the host's address, the gateway and an "outside" address reachable).
"""

from __future__ import annotations

import fcntl
import ipaddress
import json
import logging
import os
import shutil
import socket
import subprocess
from typing import Iterable
from urllib.parse import urlsplit

log = logging.getLogger("polar_mq.runtimes.egress")

METADATA = "169.254.0.0/16"
SLIRP_DNS = "10.0.2.3"  # slirp4netns's resolver: it asks the host's, from the host's stack
CHAIN = "POLAR-EGRESS"
NS_GET_USERNS = 0xB701  # ioctl: the user namespace owning a namespace (linux/nsfs.h)


def host_network_allowed() -> bool:
    """The operator's opt-out: allow_internet sandboxes share the host network (unsafe)."""
    return os.environ.get("POLAR_SANDBOX_HOST_NETWORK", "").lower() in ("1", "true", "yes")


def _resolve(host: str) -> list[str]:
    try:
        ipaddress.ip_network(host, strict=False)
        return [host]
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None, socket.AF_INET, socket.SOCK_STREAM)
    except OSError:
        return []
    return sorted({str(i[4][0]) for i in infos})


def _url_hosts(url: str) -> list[str]:
    """The hosts a URL names (a Sentinel URL names several)."""
    from polar_mq.store.redis_url import is_sentinel, parse_sentinel

    if not url:
        return []
    if is_sentinel(url):
        try:
            return [h for h, _ in parse_sentinel(url).sentinels]
        except ValueError:
            return []
    host = urlsplit(url).hostname
    return [host] if host else []


def host_addresses() -> list[str]:
    """Every IPv4 address of this host's network namespace but loopback (`ip -j addr`)."""
    out: set[str] = set()
    try:
        got = subprocess.run(["ip", "-j", "-4", "addr", "show"], capture_output=True, text=True, timeout=10)
        for link in json.loads(got.stdout or "[]"):
            for addr in link.get("addr_info", []):
                if addr.get("local"):
                    out.add(addr["local"])
    except (OSError, ValueError, subprocess.SubprocessError):
        out.update(_resolve(socket.gethostname()))
    return sorted(a for a in out if not ipaddress.ip_address(a).is_loopback)


def hub_urls(extra: Iterable[str] = ()) -> list[str]:
    """The URLs whose hosts are the hub's, from this worker's settings (and `extra`)."""
    from polar_mq.settings import GatewaySettings, PipelineSettings

    s = PipelineSettings.from_env()
    urls = [s.redis_url, s.gateway_url, s.gateway_redis_url or "", os.environ.get("POLAR_API_URL", ""),
            os.environ.get("POLAR_GATEWAY_PUBLIC_URL", ""), *GatewaySettings.from_env().upstreams, *extra]
    return [u for u in urls if u]


def blocked_networks(extra_urls: Iterable[str] = ()) -> list[str]:
    """CIDRs an allow_internet sandbox must not reach (IPv4; slirp4netns and the egress bridge
    give the sandbox no IPv6 route)."""
    nets: list[str] = [METADATA]
    for url in hub_urls(extra_urls):
        for host in _url_hosts(url):
            nets += _resolve(host)
    nets += host_addresses()
    for item in (os.environ.get("POLAR_SANDBOX_BLOCK") or "").split(","):
        if item.strip():
            nets += _resolve(item.strip())
    out: list[str] = []
    for n in nets:
        try:
            net = ipaddress.ip_network(n, strict=False)
        except ValueError:
            continue
        if net.version != 4 or net.is_loopback:  # the sandbox's loopback is its own
            continue
        if str(net) not in out:
            out.append(str(net))
    return out


# ---- bwrap: slirp4netns in the sandbox's network namespace --------------------------------------

def slirp_path() -> str | None:
    return shutil.which("slirp4netns")


class SlirpNet:
    """User-mode networking for the network namespace of process `pid` (a bwrap sandbox blocked
    on --block-fd), with `blocked` made unreachable by prohibit routes; `close()` ends slirp4netns."""

    def __init__(self, pid: int, blocked: list[str]):
        binary = slirp_path()
        if binary is None:
            raise RuntimeError("runtime.allow_internet under bwrap needs slirp4netns (apt-get install "
                               "slirp4netns): without it the sandbox would share the host network")
        # The user namespace that OWNS the sandbox's netns (unprivileged bwrap nests a second one
        # inside it, where joining the netns is refused): NS_GET_USERNS on the netns itself.
        self._fds: list[int] = []
        net_fd = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY)
        self._fds.append(net_fd)
        user_fd = fcntl.ioctl(net_fd, NS_GET_USERNS)
        self._fds.append(user_fd)
        in_userns = os.fstat(user_fd).st_ino != os.stat("/proc/self/ns/user").st_ino
        exit_r, self._exit_w = os.pipe()
        ready_r, ready_w = os.pipe()
        args = [binary, "--configure", "--mtu=65520", "--disable-host-loopback",
                f"--exit-fd={exit_r}", f"--ready-fd={ready_w}", "--netns-type=path"]
        if in_userns:
            args.append(f"--userns-path=/proc/self/fd/{user_fd}")
        self.proc = subprocess.Popen(args + [f"/proc/self/fd/{net_fd}", "tap0"],
                                     pass_fds=(exit_r, ready_w, net_fd, user_fd),
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
        os.close(exit_r)
        os.close(ready_w)
        try:
            with os.fdopen(ready_r, "rb") as ready:
                if ready.read(1) != b"1":
                    err = self.proc.stderr.read().decode(errors="replace")[-500:] if self.proc.stderr else ""
                    raise RuntimeError(f"slirp4netns could not configure the sandbox's network: {err}")
            enter = ["nsenter", f"--net=/proc/self/fd/{net_fd}"]
            if in_userns:
                enter += [f"--user=/proc/self/fd/{user_fd}", "--preserve-credentials"]
            batch = "".join(f"route add prohibit {net}\n" for net in blocked)
            got = subprocess.run(enter + ["ip", "-batch", "-"], input=batch, capture_output=True, text=True,
                                 timeout=30, pass_fds=(net_fd, user_fd))
            if got.returncode != 0:
                raise RuntimeError(f"cannot block the hub's addresses in the sandbox: {got.stderr.strip()}")
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        for fd in [self._exit_w, *self._fds]:  # slirp4netns exits when its exit fd closes
            try:
                os.close(fd)
            except OSError:
                pass
        self._fds = []
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stderr:
            self.proc.stderr.close()


def read_child_pid(info_fd: int) -> int:
    """The sandbox's pid from bwrap's --info-fd JSON (read until the object closes)."""
    data = b""
    while b"}" not in data:
        chunk = os.read(info_fd, 4096)
        if not chunk:
            raise RuntimeError(f"bwrap exited before creating the sandbox: {data!r}")
        data += chunk
    return int(json.loads(data[:data.index(b"}") + 1])["child-pid"])


# ---- docker: a bridge network and iptables rules ------------------------------------------------

def docker_network(client, name: str | None = None) -> str:
    """The egress bridge network's name (created on first use, bridge interface `polar-egress0`)."""
    from docker.errors import NotFound

    name = name or os.environ.get("POLAR_DOCKER_EGRESS_NETWORK") or "polar-egress"
    from docker.errors import APIError

    try:
        client.networks.get(name)
    except NotFound:
        try:
            client.networks.create(name, driver="bridge", check_duplicate=True,
                                   options={"com.docker.network.bridge.name": bridge_ifname(name)})
        except APIError:  # another worker made it first (409): use theirs
            client.networks.get(name)
    return name


def bridge_ifname(network: str) -> str:
    return (network.replace("_", "-")[:13] + "0")[:15]


def iptables_rules(bridge: str, blocked: list[str], docker_user: bool = False) -> list[list[str]]:
    """iptables argv lists (after `iptables`) that make the blocked networks unreachable from
    `bridge`: the chain, a REJECT per network, and jumps from INPUT (the host itself) and FORWARD,
    and from DOCKER-USER where dockerd manages iptables (its FORWARD rules come first)."""
    rules = [["-N", CHAIN], ["-F", CHAIN]]
    for net in blocked:
        rules.append(["-A", CHAIN, "-d", net, "-j", "REJECT", "--reject-with", "icmp-admin-prohibited"])
    for chain in ("INPUT", "FORWARD") + (("DOCKER-USER",) if docker_user else ()):
        rules.append(["-D", chain, "-i", bridge, "-j", CHAIN])  # idempotent: at most one jump
        rules.append(["-I", chain, "1", "-i", bridge, "-j", CHAIN])
    return rules


def enforce_docker(bridge: str, blocked: list[str]) -> str | None:
    """Install the rules (root with iptables); returns why not, or None when enforced."""
    iptables = shutil.which("iptables")
    if os.geteuid() != 0 or iptables is None:
        return "not root or no iptables: the hub's addresses are not blocked for docker sandboxes"
    docker_user = subprocess.run([iptables, "-w", "-S", "DOCKER-USER"], capture_output=True).returncode == 0
    for rule in iptables_rules(bridge, blocked, docker_user):
        got = subprocess.run([iptables, "-w", *rule], capture_output=True, text=True, timeout=30)
        if got.returncode != 0 and rule[0] not in ("-N", "-D"):
            return f"iptables {' '.join(rule)}: {got.stderr.strip()}"
    return None


def remove_docker_rules(bridge: str) -> None:
    """Undo enforce_docker for `bridge` (the jumps; the chain goes once nothing jumps to it)."""
    iptables = shutil.which("iptables")
    if iptables is None:
        return
    for chain in ("INPUT", "FORWARD", "DOCKER-USER"):
        while subprocess.run([iptables, "-w", "-D", chain, "-i", bridge, "-j", CHAIN],
                             capture_output=True).returncode == 0:
            pass
    subprocess.run([iptables, "-w", "-F", CHAIN], capture_output=True)
    subprocess.run([iptables, "-w", "-X", CHAIN], capture_output=True)
