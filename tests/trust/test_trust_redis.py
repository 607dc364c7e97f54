"""The embedded Redis `polar-mq up` starts requires a password ($POLAR_HOME/redis.password, 0600),
binds loopback and never shows the password on a command line; a URL without it gets NOAUTH, and
every role given such a URL stops with a message that says so."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from tests.support.servers import ROOT
from polar_mq.cli.embedded_redis import ensure_redis


@pytest.fixture()
def protected(tmp_path, monkeypatch):
    monkeypatch.setenv("POLAR_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("POLAR_REDIS_URL", raising=False)
    url, server = ensure_redis()
    assert server is not None
    yield url, server, tmp_path / "home"
    server.stop()


def test_embedded_redis_needs_the_generated_password(protected):
    url, server, home = protected
    password_file = home / "redis.password"
    password = password_file.read_text().strip()
    assert stat.S_IMODE(password_file.stat().st_mode) == 0o600 and len(password) >= 32
    assert f":{password}@127.0.0.1:" in url
    bare = url.replace(f":{password}@", "")
    with pytest.raises(redis.AuthenticationError):
        redis.Redis.from_url(bare).ping()
    host, port = bare.split("://")[1].split("/")[0].split(":")
    with socket.create_connection((host, int(port)), timeout=5) as s:  # the wire answer itself
        s.sendall(b"PING\r\n")
        assert s.recv(200).startswith(b"-NOAUTH")
    with pytest.raises(redis.AuthenticationError):
        redis.Redis.from_url(url.replace(password, "wrong")).ping()
    r = redis.Redis.from_url(url)
    assert r.ping() and r.config_get("bind")["bind"] == "127.0.0.1"
    cmdline = Path(f"/proc/{server.process.pid}/cmdline").read_bytes()
    assert password.encode() not in cmdline  # in a 0600 config file, not on the command line


@pytest.mark.parametrize("role", [["api", "--host", "127.0.0.1", "--port", "1"],
                                  ["worker", "--stage", "init"],
                                  ["gateway", "--upstream", "http://127.0.0.1:1", "--port", "1"]])
def test_every_role_says_noauth_when_its_url_has_no_credentials(protected, role):
    url, _, home = protected
    bare = url.rpartition("@")[0].partition("://")[0] + "://" + url.rpartition("@")[2]
    env = {**os.environ, "POLAR_HOME": str(home)}
    env.pop("POLAR_REDIS_URL", None)
    args = [sys.executable, "-m", "polar_mq.cli", *role, "--redis", bare]
    proc = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])
    assert "NOAUTH" in proc.stderr and "credentials" in proc.stderr, proc.stderr[-2000:]
    assert str(home / "redis.password") in proc.stderr
