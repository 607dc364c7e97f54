"""Callbacks are signed (X-Polar-Signature: HMAC-SHA256 of timestamp.body keyed by the callback
secret, never a service token), go only where the operator allows internal addresses, follow no
redirect, and a callback whose retries are spent is a visible dead letter in the task status."""

from __future__ import annotations

import http.server
import os
import stat
import threading
import time

import pytest
import requests

from tests.support.servers import AUTH, TOKEN, stop
from tests.support.pipeline import agent_task, make_pipeline
from polar_mq.tasks.app import callback_guard
from polar_mq import auth as tokens

SECRET = "callback-secret-for-tests"


class Receiver:
    """Verifies every callback's signature; answers `status` (200 = accept)."""

    def __init__(self, status: int, location: str | None = None):
        self.got: list[dict] = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                body = self.rfile.read(int(self.headers["Content-Length"]))
                outer.got.append({"body": body, "event": self.headers["X-Polar-Event"],
                                  "delivery": self.headers["X-Polar-Delivery"],
                                  "valid": tokens.verify(body, SECRET, self.headers[tokens.TIMESTAMP_HEADER],
                                                         self.headers[tokens.SIGNATURE_HEADER]),
                                  "forged": tokens.verify(body + b" ", SECRET, self.headers[tokens.TIMESTAMP_HEADER],
                                                          self.headers[tokens.SIGNATURE_HEADER]),
                                  "api_token": tokens.verify(body, TOKEN, self.headers[tokens.TIMESTAMP_HEADER],
                                                             self.headers[tokens.SIGNATURE_HEADER])})
                self.send_response(status)
                if location:
                    self.send_header("Location", location)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def test_signed_callbacks_and_dead_letters_in_the_task_status(gateway, tmp_path, log_dir):
    from tests.api.test_api import start_api

    good, bad = Receiver(200), Receiver(500)
    target = Receiver(200)
    redirecting = Receiver(307, location=target.url)
    p = make_pipeline(gateway, tmp_path, POLAR_CALLBACK_RETRIES="2", POLAR_CALLBACK_BACKOFF="0.1",
                      POLAR_CALLBACK_SECRET=SECRET, POLAR_CALLBACK_ALLOW="127.0.0.1/32")
    api = start_api(log_dir, p.redis_url, name="api-callbacks")
    try:
        for stage in ("init", "run", "postrun"):
            p.start_worker(stage, 1)
        ok_task, ok_sids = p.submit(agent_task(num_samples=1, callback_url=good.url))
        dead_task, dead_sids = p.submit(agent_task(num_samples=1, callback_url=bad.url))
        moved_task, moved_sids = p.submit(agent_task(num_samples=1, callback_url=redirecting.url))
        # stored before the operator's allowance changed (or DNS did): the worker checks again
        metadata_task, metadata_sids = p.submit(agent_task(num_samples=1,
                                                           callback_url="http://169.254.169.254/latest/"))
        p.wait(ok_sids + dead_sids + moved_sids + metadata_sids, timeout=90)
        deadline = time.time() + 30
        while time.time() < deadline:
            st = requests.get(f"{api.url}/v1/tasks/{dead_task}", headers=AUTH, timeout=10).json()
            if len(st["callbacks"]) == 2 and all(c["state"] == "dead_letter" for c in st["callbacks"]):
                break
            time.sleep(0.2)
        assert {c["event"] for c in st["callbacks"]} == {"session.finished", "task.finished"}
        for c in st["callbacks"]:
            assert c["state"] == "dead_letter" and c["attempts"] == 3, c
            assert c["last_error"] == "receiver answered 500" and c["url"] == bad.url
        assert len(bad.got) == 6 and len({g["delivery"] for g in bad.got}) == 2  # retries keep their id

        ok = requests.get(f"{api.url}/v1/tasks/{ok_task}", headers=AUTH, timeout=10).json()["callbacks"]
        assert sorted(c["state"] for c in ok) == ["delivered", "delivered"] and all(c["attempts"] == 1 for c in ok)
        assert sorted(g["event"] for g in good.got) == ["session.finished", "task.finished"]
        assert all(g["valid"] and not g["forged"] and not g["api_token"] for g in good.got + bad.got)

        deadline = time.time() + 30
        while time.time() < deadline:
            moved = requests.get(f"{api.url}/v1/tasks/{moved_task}", headers=AUTH, timeout=10).json()["callbacks"]
            if len(moved) == 2 and all(c["state"] == "dead_letter" for c in moved):
                break
            time.sleep(0.2)
        assert all(c["last_error"] == "receiver answered 307 (redirects are not followed)" for c in moved), moved
        assert redirecting.got and not target.got  # the redirect was never followed
        meta = requests.get(f"{api.url}/v1/tasks/{metadata_task}", headers=AUTH, timeout=10).json()["callbacks"]
        assert meta and all(c["state"] == "dead_letter" and c["attempts"] == 1 and "169.254.169.254" in
                            c["last_error"] for c in meta), meta
    finally:
        for server in (good, bad, target, redirecting):
            server.server.shutdown()
        stop(api.proc)
        p.stop()


@pytest.fixture(scope="module")
def plain_api(log_dir, redis_url):
    from tests.api.test_api import start_api

    import redis

    url = redis_url.rsplit("/", 1)[0] + "/9"
    redis.Redis.from_url(url).flushdb()
    server = start_api(log_dir, url, name="api-callback-urls")
    yield server
    stop(server.proc)


@pytest.mark.parametrize("url", ["http://127.0.0.1:8700/v1/admin/pause", "http://localhost/hook",
                                 "http://169.254.169.254/latest/meta-data/", "http://10.0.0.1/hook",
                                 "http://[::1]:80/", "http://0.0.0.0:6379/", "http://192.168.1.5/",
                                 "http://[::ffff:127.0.0.1]/"])
def test_internal_callback_urls_are_refused_at_submit(plain_api, url):
    task = {"instruction": "x", "agent": {"harness": "codex"}, "callback_url": url}
    resp = requests.post(f"{plain_api.url}/v1/tasks", json=task, headers=AUTH, timeout=10)
    assert resp.status_code == 400, resp.text
    body = resp.json()
    assert body["field"] == "callback_url" and "POLAR_CALLBACK_ALLOW" in body["detail"], body
    assert requests.get(f"{plain_api.url}/v1/tasks", headers=AUTH, timeout=10).json()["tasks"] == []


def test_callback_allow_lists_cidrs_and_names():
    assert callback_guard.refused("http://10.1.2.3/x", "10.0.0.0/8") is None
    assert callback_guard.refused("http://10.1.2.3/x", "192.168.0.0/16") is not None
    assert callback_guard.refused("http://localhost:9/x", "localhost") is None
    assert callback_guard.refused("http://8.8.8.8/x", "") is None  # a public address needs no allowance
    assert callback_guard.refused("http://no-such-host.invalid/x", "") is not None


def test_callback_secret_is_generated_0600_and_is_not_the_token(tmp_path, monkeypatch):
    monkeypatch.setenv("POLAR_HOME", str(tmp_path))
    monkeypatch.delenv("POLAR_CALLBACK_SECRET", raising=False)
    secret = callback_guard.callback_secret()
    path = tmp_path / "callback.secret"
    assert path.read_text().strip() == secret and secret not in (TOKEN, os.environ.get("POLAR_API_TOKEN"))
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert callback_guard.callback_secret() == secret  # stable across calls
    monkeypatch.setenv("POLAR_CALLBACK_SECRET", "from-env")
    assert callback_guard.callback_secret() == "from-env"
