"""Run a pinned harness CLI once against a local recorder: every request it makes is kept and
answered so that it stops (400 to a model call, 200 to a HEAD probe, 426 to a GET, the WebSocket
upgrade Codex tries first). ``codex_task.capture`` and ``claude_task.capture`` check what it kept;
tests/rl/test_codex_task.py and tests/rl/test_claude_task.py guard both."""

from __future__ import annotations

import http.server
import subprocess
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable


@dataclass
class Captured:
    requests: list[tuple[str, str, bytes]] = field(default_factory=list)  # (method, path, body)
    proc: subprocess.CompletedProcess | None = None

    def posts(self) -> list[tuple[str, bytes]]:
        return [(path, body) for method, path, body in self.requests if method == "POST"]


def run_against_recorder(launch: Callable[[str, Path, Path], tuple[list[str], dict[str, str]]], error: bytes,
                         timeout: float = 120.0) -> Captured:
    """``launch(url, home, work)`` -> (argv, env) of the CLI pointed at the recorder's ``url``; the
    CLI runs in ``work`` with ``home`` as its home; ``error``: the body of the 400 a POST gets."""
    got = Captured()

    class Recorder(http.server.BaseHTTPRequestHandler):
        def _answer(self, status: int, body: bytes = b"") -> None:
            n = int(self.headers.get("content-length") or 0)
            got.requests.append((self.command, self.path, self.rfile.read(n) if n else b""))
            self.send_response(status)
            if body:
                self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_HEAD(self) -> None:
            self._answer(200)

        def do_GET(self) -> None:
            self._answer(426)

        def do_POST(self) -> None:
            self._answer(400, error)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with tempfile.TemporaryDirectory(prefix="grpo-capture-") as tmp:
            home, work = Path(tmp) / "home", Path(tmp) / "work"
            home.mkdir()
            work.mkdir()
            argv, env = launch(f"http://127.0.0.1:{server.server_address[1]}", home, work)
            got.proc = subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True, timeout=timeout)
    finally:
        server.shutdown()
        server.server_close()
    return got
