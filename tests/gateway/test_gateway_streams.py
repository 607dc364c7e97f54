"""One gateway worker process holds hundreds of streams at once (issue 15; gevent workers).

256 streamed chat calls are opened over ~4 s against the suite's gateway (one gunicorn worker
process, as shipped) while the stand-in sleeps before the first token, so all of them are open
at the same time; every one must answer 200 with content, none may wait for another, and every
one must be recorded with its token ids. A gthread worker (64 threads) would serve them 64 at a
time: the last streams would finish only after several rounds of the upstream's sleep.
The full 1,024-stream figure is bench/bench_gateway_streams.py.
"""

from __future__ import annotations

import asyncio
import json
import time
from urllib.parse import urlsplit

import pytest

N_STREAMS = 256
RAMP_S = 4.0
SLEEP_S = 6.0


async def _stream(host: str, port: int, path: str, payload: bytes, t_start: float) -> dict:
    reader, writer = await asyncio.open_connection(host, port)
    opened = time.monotonic() - t_start
    writer.write(f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n".encode() + payload)
    await writer.drain()
    data = b""
    while True:
        piece = await reader.read(65536)
        if not piece:
            break
        data += piece
    writer.close()
    return {"opened": opened, "ended": time.monotonic() - t_start, "data": data}


async def _storm(url: str, path: str, body: dict) -> list[dict]:
    parts = urlsplit(url)
    payload = json.dumps(body).encode()
    t_start = time.monotonic()
    tasks = []
    for _ in range(N_STREAMS):
        tasks.append(asyncio.create_task(_stream(parts.hostname, parts.port, path, payload, t_start)))
        await asyncio.sleep(RAMP_S / N_STREAMS)
    return await asyncio.gather(*tasks)


def test_one_worker_holds_hundreds_of_streams(gateway, session):
    body = {"model": "stand-in", "max_tokens": 4, "stream": True,
            "messages": [{"role": "user", "content": f"hello polar:notool polar:sleep={SLEEP_S}"}]}
    t0 = time.monotonic()
    results = asyncio.run(_storm(gateway.url, f"/s/{session['key']}/v1/chat/completions", body))
    elapsed = time.monotonic() - t0

    bad = [r["data"][:300] for r in results if not r["data"].startswith(b"HTTP/1.1 200")
           or b'"content":"' not in r["data"] or b"[DONE]" not in r["data"]]
    assert not bad, f"{len(bad)} of {N_STREAMS} streams failed, e.g. {bad[0]!r}"
    # All open at once: the last stream was opened before the first one ended.
    last_open = max(r["opened"] for r in results)
    first_end = min(r["ended"] for r in results)
    assert last_open < first_end, (last_open, first_end)
    # No stream waited for a free worker: each took about the upstream's sleep, not rounds of it.
    assert elapsed < RAMP_S + 2 * SLEEP_S, elapsed
    calls = gateway.calls(session["session_id"])
    assert len(calls) == N_STREAMS
    assert all(c["status"] == "ok" and c["prompt_token_ids"] and c["completion_token_ids"] for c in calls)


HIGH_FD_WRAPPER = """
import os, resource, sys
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 8192)), hard))
for _ in range(1100):  # inherited by the gateway: every socket it opens gets a descriptor >= 1100
    os.set_inheritable(os.dup(0), True)
os.execv(sys.executable, [sys.executable, *sys.argv[1:]])
"""


@pytest.fixture(scope="module")
def high_fd_gateway(log_dir, redis_url, model_server):
    """A gateway whose sockets all have descriptors past select()'s FD_SETSIZE (1024), as a worker
    holding ~1,000 streams has them."""
    import resource
    import sys

    from tests.support.servers import GatewayHandle, free_port, spawn, stop

    if resource.getrlimit(resource.RLIMIT_NOFILE)[1] < 2048:
        pytest.skip("the hard limit on open files is below 2048 here")
    port = free_port()
    args = [sys.executable, "-c", HIGH_FD_WRAPPER, "-m", "polar_mq.cli", "gateway", "--host", "127.0.0.1",
            "--port", str(port), "--redis", redis_url, "--workers", "1", "--upstream", model_server]
    server = spawn(args, f"http://127.0.0.1:{port}/health", log_dir, f"gateway-highfd-{port}",
                   env={"POLAR_SPOOL_DIR": str(log_dir / f"spool-{port}")})
    yield GatewayHandle(url=server.url, upstream_url=model_server, redis_url=redis_url, server=server)
    stop(server.proc)


def test_streams_on_descriptors_past_1024_are_not_taken_for_gone_clients(high_fd_gateway):
    """The call watcher's client-gone check used select.select, which refuses descriptors >= 1024:
    the error read as "client gone" and the stream was aborted after its first event (523 of
    1,024 streams in bench/bench_gateway_streams.py). Streams held past the watcher's ticks here
    must all finish with content."""
    session = high_fd_gateway.new_session()
    body = {"model": "stand-in", "max_tokens": 4, "stream": True,
            "messages": [{"role": "user", "content": "hello polar:notool polar:sleep=1.5"}]}
    parts = urlsplit(high_fd_gateway.url)
    path = f"/s/{session['key']}/v1/chat/completions"

    async def storm() -> list[dict]:
        payload = json.dumps(body).encode()
        t0 = time.monotonic()
        return await asyncio.gather(*[_stream(parts.hostname, parts.port, path, payload, t0) for _ in range(16)])

    results = asyncio.run(storm())
    bad = [r["data"][-300:] for r in results if b'"content":"' not in r["data"] or b"[DONE]" not in r["data"]
           or b"cancelled" in r["data"]]
    assert not bad, f"{len(bad)} of 16 streams failed, e.g. {bad[0]!r}"
    calls = high_fd_gateway.calls(session["session_id"])
    assert len(calls) == 16 and all(c["status"] == "ok" for c in calls)
