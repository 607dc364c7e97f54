"""polar_mq._io.gunicorn_tuning gives gunicorn's own answers: the Date header, the forwarded-header
trust check, and a reply's bytes (now in one write where gunicorn made two)."""

from __future__ import annotations

import email.utils
import socket
import time

import pytest
from gunicorn import util
from gunicorn.config import Config
from gunicorn.http import message, wsgi
from gunicorn.http.parser import RequestParser

from polar_mq._io import gunicorn_tuning

original_write = getattr(wsgi.Response.write, "__wrapped__", wsgi.Response.write)
original_check = message._ip_in_allow_list
if hasattr(original_check, "__wrapped__"):  # pragma: no cover - only if installed in this process
    original_check = original_check.__wrapped__


def test_http_date_is_gunicorns_and_follows_the_clock() -> None:
    calls = []

    def fmt(timestamp: float | None = None) -> str:
        calls.append(timestamp)
        return email.utils.formatdate(timestamp, localtime=False, usegmt=True)

    date = gunicorn_tuning.cached_http_date(fmt)
    first = date()
    assert first == email.utils.formatdate(time.time(), usegmt=True) or \
        first == email.utils.formatdate(time.time() - 1, usegmt=True)
    for _ in range(50):
        assert date() in (first, email.utils.formatdate(time.time(), usegmt=True))
    assert len(calls) <= 2, "formatted once a second, not once a request"
    assert date(0.0) == "Thu, 01 Jan 1970 00:00:00 GMT"  # an explicit time is formatted as asked
    time.sleep(1.05)
    assert date() != first, "the cached text moves on with the clock"


@pytest.mark.parametrize("allow", ["127.0.0.1", "10.0.0.0/8,192.168.1.7", "*", "::1,fd00::/8", ""])
def test_trust_check_answers_as_gunicorns(allow: str) -> None:
    cfg = Config()
    cfg.set("forwarded_allow_ips", allow)
    check = gunicorn_tuning.cached_allow_list(original_check)
    allow_list, networks = cfg.forwarded_allow_ips, cfg.forwarded_allow_networks()
    for ip in ["127.0.0.1", "10.1.2.3", "192.168.1.7", "192.168.1.8", "::1", "fd00::5", "not-an-ip", "8.8.8.8"]:
        want = original_check(ip, allow_list, networks)
        assert check(ip, allow_list, networks) == want
        assert check(ip, allow_list, networks) == want  # the remembered answer


def test_trust_check_never_answers_from_another_config() -> None:
    check = gunicorn_tuning.cached_allow_list(original_check)
    trusting, strict = Config(), Config()
    trusting.set("forwarded_allow_ips", "10.0.0.0/8")
    strict.set("forwarded_allow_ips", "127.0.0.1")
    assert check("10.1.2.3", trusting.forwarded_allow_ips, trusting.forwarded_allow_networks()) is True
    assert check("10.1.2.3", strict.forwarded_allow_ips, strict.forwarded_allow_networks()) is False


def test_trust_cache_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gunicorn_tuning, "TRUST_CACHE_SIZE", 8)
    seen = []

    def counting(ip: str, allow_list: object, networks: object) -> bool:
        seen.append(ip)
        return original_check(ip, allow_list, networks)

    cfg = Config()
    check = gunicorn_tuning.cached_allow_list(counting)
    for i in range(20):
        check(f"10.0.0.{i}", cfg.forwarded_allow_ips, cfg.forwarded_allow_networks())
    check("10.0.0.19", cfg.forwarded_allow_ips, cfg.forwarded_allow_networks())
    assert len(seen) == 20  # the last was remembered: the cache keeps working after a reset


class Recorder:
    """A socket that records each sendall."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []

    def sendall(self, data: bytes) -> None:
        self.writes.append(bytes(data))


def reply(write, headers: list[tuple[str, str]], parts: list[bytes], method: str = "GET") -> list[bytes]:
    cfg = Config()
    req = next(iter(RequestParser(cfg, [f"{method} /x HTTP/1.1\r\nHost: h\r\n\r\n".encode()], ("127.0.0.1", 5))))
    sock = Recorder()
    resp, _ = wsgi.create(req, sock, ("127.0.0.1", 5), ("127.0.0.1", 80), cfg)
    resp.start_response("200 OK", headers)
    for part in parts:
        write(resp, part)
    resp.close()
    return sock.writes


@pytest.mark.parametrize("case", ["sized", "sized_in_parts", "chunked", "head"])
def test_reply_bytes_are_gunicorns_in_one_write_when_whole(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(util, "http_date", lambda timestamp=None: "Thu, 01 Jan 1970 00:00:00 GMT")
    body = b'{"id":"chatcmpl-1","choices":[]}'
    headers = [("Content-Type", "application/json")]
    parts = [body]
    method = "GET"
    if case in ("sized", "head"):
        headers.append(("Content-Length", str(len(body))))
        method = "HEAD" if case == "head" else "GET"
    elif case == "sized_in_parts":
        headers.append(("Content-Length", str(len(body))))
        parts = [body[:10], body[10:]]
    fast = gunicorn_tuning.one_write(original_write)
    want = reply(original_write, headers, parts, method)
    got = reply(fast, headers, parts, method)
    assert b"".join(got) == b"".join(want)
    if case == "sized":
        assert len(want) == 2 and len(got) == 1, "head and a whole body leave in one write"
    else:
        assert len(got) == len(want), "anything else is written as gunicorn writes it"


def test_installed_in_the_served_gateway(gateway) -> None:
    """The real gateway: a reply gunicorn writes itself (GET, not the lean path) has a correct
    Date and arrives whole and sized."""
    import requests

    resp = requests.get(f"{gateway.url}/health", timeout=10)
    date = email.utils.parsedate_to_datetime(resp.headers["Date"])
    assert abs(date.timestamp() - time.time()) < 5
    with socket.create_connection(("127.0.0.1", int(gateway.url.rsplit(":", 1)[1])), timeout=10) as s:
        s.sendall(b"GET /sessions/nope HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 40"), head
    date = [line.split(b":", 1)[1].strip() for line in head.split(b"\r\n") if line.lower().startswith(b"date:")][0]
    assert abs(email.utils.parsedate_to_datetime(date.decode()).timestamp() - time.time()) < 5
    length = int([line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")][0])
    assert len(body) == length
