"""Callbacks are signed (X-Polar-Signature: HMAC-SHA256 of timestamp.body with the token) and a
callback whose retries are spent is a visible dead letter in the task status, never silence."""

from __future__ import annotations

import http.server
import threading
import time

import requests

from conftest import AUTH, TOKEN, stop
from pipeline_support import agent_task, make_pipeline
from polar_mq import tokens


class Receiver:
    """Verifies every callback's signature; answers `status` (200 = accept)."""

    def __init__(self, status: int):
        self.got: list[dict] = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                body = self.rfile.read(int(self.headers["Content-Length"]))
                outer.got.append({"body": body, "event": self.headers["X-Polar-Event"],
                                  "delivery": self.headers["X-Polar-Delivery"],
                                  "valid": tokens.verify(body, TOKEN, self.headers[tokens.TIMESTAMP_HEADER],
                                                         self.headers[tokens.SIGNATURE_HEADER]),
                                  "forged": tokens.verify(body + b" ", TOKEN, self.headers[tokens.TIMESTAMP_HEADER],
                                                          self.headers[tokens.SIGNATURE_HEADER])})
                self.send_response(status)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def test_signed_callbacks_and_dead_letters_in_the_task_status(gateway, tmp_path, log_dir):
    from test_api import start_api

    good, bad = Receiver(200), Receiver(500)
    p = make_pipeline(gateway, tmp_path, POLAR_CALLBACK_RETRIES="2", POLAR_CALLBACK_BACKOFF="0.1")
    api = start_api(log_dir, p.redis_url, name="api-callbacks")
    try:
        for stage in ("init", "run", "postrun"):
            p.start_worker(stage, 1)
        ok_task, ok_sids = p.submit(agent_task(num_samples=1, callback_url=good.url))
        dead_task, dead_sids = p.submit(agent_task(num_samples=1, callback_url=bad.url))
        p.wait(ok_sids + dead_sids, timeout=90)
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
        assert all(g["valid"] and not g["forged"] for g in good.got + bad.got)
    finally:
        good.server.shutdown()
        bad.server.shutdown()
        stop(api.proc)
        p.stop()
