"""Where callbacks may go, and the secret that signs them.

A `callback_url` whose host is, or resolves to, a loopback, link-local (the cloud metadata address
169.254.169.254 included), private, unspecified, multicast or reserved address is refused (400 at
submit; the callback worker checks again before each delivery, as DNS may have changed), unless
`POLAR_CALLBACK_ALLOW` (comma-separated CIDRs and host names) allows it. Workers would otherwise
post to internal services on the submitter's behalf. Redirects are never followed (callbacks.py).

Callbacks are signed with a secret of their own: `POLAR_CALLBACK_SECRET`, else
`$POLAR_HOME/callback.secret` (generated, 0600), never a service token, so a receiver that
verifies signatures holds nothing that opens the API (tests/trust/test_trust_callbacks.py).
"""

from __future__ import annotations

import ipaddress
import os
import socket
from pathlib import Path
from urllib.parse import urlsplit

from polar_mq.settings import polar_home

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


def secret_file() -> Path:
    return polar_home() / "callback.secret"


def callback_secret(explicit: str | None = None) -> str:
    """The key of X-Polar-Signature: `explicit` (settings), POLAR_CALLBACK_SECRET, else the file
    $POLAR_HOME/callback.secret (created 0600 on first use). Hosts that share callbacks' receivers
    set POLAR_CALLBACK_SECRET to one value (docs/security.md)."""
    from polar_mq import auth as tokens

    return explicit or os.environ.get("POLAR_CALLBACK_SECRET") or tokens.ensure_file(secret_file())


def parse_allow(spec: str | None) -> tuple[list[IPNetwork], set[str]]:
    """(networks, host names) of a POLAR_CALLBACK_ALLOW value; entries that are not CIDRs are names."""
    nets: list[IPNetwork] = []
    names: set[str] = set()
    for item in (spec or "").split(","):
        item = item.strip()
        if not item:
            continue
        try:
            nets.append(ipaddress.ip_network(item, strict=False))
        except ValueError:
            names.add(item.lower().rstrip("."))
    return nets, names


def _internal(ip: IPAddress) -> bool:
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return _internal(ip.ipv4_mapped)
    return (ip.is_loopback or ip.is_link_local or ip.is_private or ip.is_unspecified or ip.is_multicast
            or ip.is_reserved or not ip.is_global)


def _addresses(host: str, port: int) -> list[IPAddress]:
    try:
        return [ipaddress.ip_address(host)]
    except ValueError:
        pass
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [ipaddress.ip_address(str(info[4][0]).split("%", 1)[0]) for info in infos]


def refused(url: str, allow: str | None = None) -> str | None:
    """Why callbacks may not go to `url`, or None. `allow`: POLAR_CALLBACK_ALLOW (default: the env)."""
    allow = os.environ.get("POLAR_CALLBACK_ALLOW") if allow is None else allow
    nets, names = parse_allow(allow)
    try:
        parts = urlsplit(url)
        host = (parts.hostname or "").rstrip(".")
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as exc:
        return f"is not a valid URL ({exc})"
    if parts.scheme not in ("http", "https") or not host:
        return "must be an http(s) URL with a host"
    if host.lower() in names:
        return None
    try:
        addresses = _addresses(host, port)
    except (OSError, UnicodeError) as exc:
        return f"host {host!r} does not resolve ({exc.__class__.__name__})"
    if not addresses:
        return f"host {host!r} does not resolve"
    for ip in addresses:
        if _internal(ip) and not any(ip.version == net.version and ip in net for net in nets):
            return (f"host {host!r} is or resolves to {ip}, a loopback, link-local, private or unspecified "
                    f"address; callbacks there need the operator's POLAR_CALLBACK_ALLOW (CIDRs or host names)")
    return None
