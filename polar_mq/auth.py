"""Service tokens: where they come from, how they are stored, compared, redacted and used to sign.

One token protects the rollout API (``POLAR_API_TOKEN``) and the gateway's admin resources
(``POLAR_GATEWAY_TOKEN``); a missing one falls back to the other, then to the token file
(``$POLAR_HOME/token``, mode 0600). A service that starts without any of them generates a token and
writes the file, so a fresh ``polar-mq up`` is never open; the CLI and ``polar_mq.client.Client``
read the same file. Workers and gateways get the token from their settings, never from a sandbox's
environment (runtimes build a sandbox's environment from scratch).

Tests: tests/trust/test_trust_tokens.py, tests/trust/test_trust_callbacks.py.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import secrets
import sys
from pathlib import Path

from polar_mq._io.redact import RedactingFilter, redact  # noqa: F401  (part of this module's interface)
from polar_mq.settings import TokenSettings

log = logging.getLogger("polar_mq.auth")

SIGNATURE_HEADER = "X-Polar-Signature"  # "sha256=<hex HMAC-SHA256 of "<timestamp>.<raw body>", keyed by the callback secret>"
TIMESTAMP_HEADER = "X-Polar-Timestamp"


def generate() -> str:
    return "pmqt-" + secrets.token_urlsafe(32)


def read_file(path: Path) -> str | None:
    """The token stored in `path`, or None when there is none (missing or empty file)."""
    try:
        text = Path(path).read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return None
    except OSError as exc:
        log.warning("cannot read the token file %s: %s", path, exc)
        return None
    return text or None


def ensure_file(path: Path) -> str:
    """The token in `path`, generating and writing one (mode 0600, parent 0700) if there is none.
    Two services starting at once agree on one token: the file is created with O_EXCL."""
    path = Path(path)
    existing = read_file(path)
    if existing:
        return existing
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    token = generate()
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, (token + "\n").encode())
    finally:
        os.close(fd)
    try:
        os.link(tmp, path)  # atomic and exclusive: fails if another process won the race
    except FileExistsError:
        token = read_file(path) or token
    finally:
        tmp.unlink(missing_ok=True)
    os.chmod(path, 0o600)
    return token


def server_token(role: str, settings: TokenSettings | None = None, *, create: bool = True) -> str | None:
    """The token a service (`role` "api" or "gateway") requires: its own variable, the other one,
    then the token file (created when `create`)."""
    s = settings or TokenSettings.from_env()
    own, other = (s.api_token, s.gateway_token) if role == "api" else (s.gateway_token, s.api_token)
    if own or other:
        return own or other
    return ensure_file(s.token_file) if create else read_file(s.token_file)


def client_token(explicit: str | None = None, settings: TokenSettings | None = None) -> str | None:
    """The token a client sends: the one given, POLAR_API_TOKEN, POLAR_GATEWAY_TOKEN, the file."""
    if explicit:
        return explicit
    return server_token("api", settings, create=False)


def auth_headers(explicit: str | None = None) -> dict[str, str]:
    """``{"Authorization": "Bearer <token>"}`` for the client token (empty when there is none)."""
    token = client_token(explicit)
    return {"Authorization": f"Bearer {token}"} if token else {}


def equal(given: str | None, expected: str | None) -> bool:
    """Constant-time comparison; never equal when either side is missing."""
    if not given or not expected:
        return False
    return hmac.compare_digest(given.encode("utf-8", "surrogatepass"), expected.encode("utf-8", "surrogatepass"))


def bearer(header: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header value."""
    scheme, _, token = (header or "").partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None


def sign(body: bytes, token: str, timestamp: str) -> str:
    """The callback signature: ``sha256=`` + hex HMAC-SHA256 over ``<timestamp>.<body>``."""
    mac = hmac.new(token.encode(), timestamp.encode() + b"." + body, hashlib.sha256)
    return "sha256=" + mac.hexdigest()


def verify(body: bytes, token: str, timestamp: str, signature: str) -> bool:
    """What a callback receiver checks (receivers may copy these four lines)."""
    return hmac.compare_digest(sign(body, token, timestamp), signature or "")


def warn_open(service: str) -> None:
    """Say loudly that a service runs without authentication (--dev)."""
    bar = "!" * 78
    print(f"{bar}\n!! polar_mq {service}: --dev, NO AUTHENTICATION. Anyone who can reach this port can "
          f"read and\n!! write every session. Never run it like this on a shared machine.\n{bar}",
          file=sys.stderr, flush=True)
