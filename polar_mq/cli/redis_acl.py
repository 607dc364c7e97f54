"""`polar-mq redis-acl`: write a Redis ACL file with one user per role and each role's URL
(store/redis_acl.py), optionally a private CA and a server certificate for TLS (``--tls``).

    polar-mq redis-acl --out DIR [--host HUB] [--port 6379] [--tls] [--sentinel]

DIR/users.acl is what redis-server loads (``--aclfile``); DIR/redis.env holds the passwords and
``POLAR_REDIS_URL_<ROLE>`` lines (0600): hand each host only its role's URL. A rerun keeps the
passwords (from DIR/redis.env or ``POLAR_REDIS_<ROLE>_PASSWORD``). With ``--tls``: DIR/tls/ca.crt,
server.crt, server.key (openssl), and ``rediss://`` URLs that name the CA.
Tests: tests/trust/test_trust_redis.py.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path


def make_tls(out: Path, hosts: list[str]) -> Path:
    """A private CA and a server certificate for `hosts` (names or IPs) under OUT/tls; returns the
    directory. Kept when present (a rerun does not change what servers and clients trust)."""
    tls = out / "tls"
    if (tls / "server.crt").is_file() and (tls / "ca.crt").is_file():
        return tls
    if shutil.which("openssl") is None:
        raise RuntimeError("--tls needs the openssl command (apt-get install openssl)")
    tls.mkdir(parents=True, exist_ok=True)
    import ipaddress

    def san(h: str) -> str:
        try:
            ipaddress.ip_address(h)
            return f"IP:{h}"
        except ValueError:
            return f"DNS:{h}"

    names = ",".join(dict.fromkeys(san(h) for h in [*hosts, "localhost", "127.0.0.1"]))
    run = lambda *a: subprocess.run(list(a), check=True, capture_output=True, cwd=tls)  # noqa: E731
    run("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "3650", "-subj",
        "/CN=polar-mq redis CA", "-keyout", "ca.key", "-out", "ca.crt")
    run("openssl", "req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={hosts[0]}", "-keyout",
        "server.key", "-out", "server.csr")
    (tls / "ext.cnf").write_text(f"subjectAltName={names}\n")
    run("openssl", "x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
        "-CAcreateserial", "-days", "3650", "-extfile", "ext.cnf", "-out", "server.crt")
    for name in ("ca.key", "server.key"):
        (tls / name).chmod(0o600)
    return tls


def main(args: argparse.Namespace) -> int:
    from polar_mq.settings import polar_home
    from polar_mq.store.redis_acl import ROLES, generate, url_env_name

    out = Path(args.out or polar_home() / "redis-acl")
    ca = None
    if args.tls:
        try:
            tls = make_tls(out, [args.host])
        except (RuntimeError, subprocess.CalledProcessError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        ca = str(Path(args.ca_path or tls / "ca.crt"))
    got = generate(out, host=args.host, port=args.port, db=args.db, tls=args.tls, ca_file=ca,
                   sentinel=args.sentinel)
    print(f"ACL file: {got.acl_file} (redis-server --aclfile {got.acl_file})")
    print(f"passwords and URLs: {got.env_file} (mode 0600): " +
          ", ".join(url_env_name(r) for r in ROLES))
    if args.tls:
        print(f"TLS: {out / 'tls'} (redis-server --tls-port {args.port} --port 0 --tls-cert-file "
              f"server.crt --tls-key-file server.key --tls-ca-cert-file ca.crt --tls-auth-clients no)")
    return 0


def add_command(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("redis-acl", help="write a Redis ACL file (a user per role) and each role's URL")
    p.add_argument("--out", help="directory (default $POLAR_HOME/redis-acl)")
    p.add_argument("--host", default="127.0.0.1", help="the Redis host the URLs name (the hub's address)")
    p.add_argument("--port", type=int, default=6379)
    p.add_argument("--db", type=int, default=0)
    p.add_argument("--tls", action="store_true",
                   help="rediss:// URLs; also a private CA and server certificate in OUT/tls")
    p.add_argument("--ca-path", help="where clients find ca.crt (default OUT/tls/ca.crt)")
    p.add_argument("--sentinel", action="store_true", help="also users for replicas and Sentinels")
    p.set_defaults(func=main)
