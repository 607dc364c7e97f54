"""The gateway's own time on a call with the record's request side encoded while the upstream
generates (core.Gateway.encode_while_waiting) and without, side by side in one process.

The gateway runs in this process under gevent's patching (as its gevent worker does), against an
embedded Redis and the stand-in model server (`--prompt-cache`: the 82 KB request is answered
without tokenizing it again). Each call's *own time* is its wall time through FastPath minus the
upstream request's (Http11Pool.request): what the gateway adds on the call's path, the work done
while the upstream generates excluded. The two modes alternate in rounds, so the box's load
moves them alike; medians and quartiles of each are printed with their ratio. Series: a small
chat call, and the largest recorded Claude Code request (82 KB, its 26 tools; Anthropic).

    python bench/bench_encode_while_waiting.py [--rounds 20] [--per-round 100]
"""

from __future__ import annotations

from gevent import monkey

monkey.patch_all()

import argparse  # noqa: E402
import io  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, Callable  # noqa: E402

import orjson  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_gateway import auth_headers, replay_request, spawn  # noqa: E402
from polar_mq.embedded_redis import free_port, start_embedded  # noqa: E402
from polar_mq.proxy_app import http11, while_waiting  # noqa: E402
from polar_mq.proxy_app.app import create_app  # noqa: E402
from polar_mq.proxy_app.fastpath import BODY_IN_MEMORY  # noqa: E402
from polar_mq.settings import GatewaySettings  # noqa: E402

SMALL = {"model": "stand-in", "max_tokens": 16, "messages": [{"role": "user", "content": "Say hello polar:notool"}]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--per-round", type=int, default=100, help="small calls per mode per round (82 KB: a third)")
    args = ap.parse_args()
    logs = Path(tempfile.mkdtemp(prefix="bench-eww-"))
    redis_server = start_embedded()
    port = free_port()
    upstream = f"http://127.0.0.1:{port}"
    model = spawn([sys.executable, "-m", "polar_mq.model_server", "--port", str(port), "--max-model-len", "65536",
                   "--prompt-cache", "64"], f"{upstream}/health", logs / "model_server.log")
    try:
        app = create_app(GatewaySettings(upstreams=[upstream], redis_url=redis_server.url,
                                         spool_dir=str(logs / "spool"), public_url="http://gw.bench"))
        fast = app.wsgi_app
        upstream_s = [0.0]
        request = http11.Http11Pool.request

        def timed_request(self: Any, *a: Any, **k: Any) -> Any:
            t = time.perf_counter()
            try:
                return request(self, *a, **k)
            finally:
                upstream_s[0] += time.perf_counter() - t

        http11.Http11Pool.request = timed_request  # type: ignore[method-assign]

        def caller(path: str, body: bytes) -> Callable[[], float]:
            session = app.test_client().post("/sessions", json={}, headers=auth_headers()).get_json()

            def call() -> float:
                status: list[str] = []
                environ = {"REQUEST_METHOD": "POST", "PATH_INFO": f"/s/{session['key']}{path}", "QUERY_STRING": "",
                           "CONTENT_TYPE": "application/json", "CONTENT_LENGTH": str(len(body)),
                           "wsgi.input": io.BytesIO(body), BODY_IN_MEMORY: True}
                upstream_s[0] = 0.0
                t = time.perf_counter()
                result = fast(environ, lambda s, h, e=None: status.append(s))
                b"".join(result)
                own = time.perf_counter() - t - upstream_s[0]
                result.close()  # the record's Redis answer: after the reply, not on the call's path
                assert status[0] == "200 OK", status
                return own
            return call

        queue = while_waiting.queue
        modes: dict[str, Callable[[Callable[[], None]], while_waiting.Queued]] = {
            "while waiting": queue, "after the answer": lambda fn: while_waiting.Queued(fn)}
        table = Table(title=f"gateway's own time per call, us ({args.rounds} alternating rounds)")
        for col in ("series", "mode", "n", "p25", "p50", "p75", "p50 ratio"):
            table.add_column(col, justify="left" if col in ("series", "mode") else "right")
        for name, path, body, per in (("small chat", "/v1/chat/completions", orjson.dumps(SMALL), args.per_round),
                                      ("82 KB Claude Code", "/v1/messages", orjson.dumps(replay_request()),
                                       max(1, args.per_round // 3))):
            call = caller(path, body)
            for _ in range(max(20, per)):
                call()
            seen: dict[str, list[float]] = {mode: [] for mode in modes}
            for r in range(args.rounds):
                for mode, impl in modes.items():
                    while_waiting.queue = impl  # type: ignore[assignment]
                    seen[mode].extend(call() for _ in range(per))
                print(f"{name}: round {r + 1}/{args.rounds}", file=sys.stderr)
            while_waiting.queue = queue
            base = sorted(seen["after the answer"])[len(seen["after the answer"]) // 2]
            for mode, values in seen.items():
                v = sorted(values)
                p50 = v[len(v) // 2]
                table.add_row(name, mode, str(len(v)), f"{v[len(v) // 4] * 1e6:.0f}", f"{p50 * 1e6:.0f}",
                              f"{v[3 * len(v) // 4] * 1e6:.0f}", f"{p50 / base:.2f}x")
        Console().print(table)
    finally:
        model.terminate()
        redis_server.stop() if hasattr(redis_server, "stop") else None


if __name__ == "__main__":
    main()
