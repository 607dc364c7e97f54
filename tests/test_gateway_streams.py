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
