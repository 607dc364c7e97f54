"""A record's envelope written in zlib's stored blocks (store/codec.py zlib_stored, what the
gateway writes) vs compressed at level 1, side by side in one run: encode time per record and stored
bytes, for the record of a small chat call and of the largest recorded Claude Code request.

Records are built as the gateway builds them (the adapter's translation of the request, prompt
ids as the text vLLM sends, 16 or 200 sampled ids with logprobs), encoded warm against a session
whose chunks are already stored (as every call after a session's first). The two ways alternate
in rounds. CPU time of the encode only; the end-to-end effect is in bench_gateway.py.

    python bench/bench_envelope.py [--rounds 20] [--per-round 200]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
import zlib
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_gateway import replay_request  # noqa: E402
from polar_mq.store import codec as record_codec  # noqa: E402
from polar_mq.model import CaptureRecord  # noqa: E402
from polar_mq.proxy_app.adapters import anthropic, openai_chat  # noqa: E402
from polar_mq._io.token_ids import TokenIds  # noqa: E402

SMALL = {"model": "stand-in", "max_tokens": 16, "messages": [{"role": "user", "content": "Say hello polar:notool"}]}


def record(provider: str, body: dict[str, Any], prompt_len: int, sampled: int) -> CaptureRecord:
    req = (anthropic if provider == "anthropic" else openai_chat).to_chat(body)
    rng = random.Random(sampled)  # sampled ids and logprobs vary as a model's do (no repeats to compress)
    ids = TokenIds.from_array_text(",".join(str(1000 + (i * 7919) % 150000) for i in range(prompt_len)).encode())
    return CaptureRecord(session_id="bench-envelope", provider=provider, stream=False, model_requested=req.model,
                         request=body, messages=req.messages, tools=req.tools, params=dict(req.params),
                         prompt_token_ids=ids, completion_token_ids=[rng.randrange(150000) for _ in range(sampled)],
                         completion_logprobs=[-rng.expovariate(4.0) for _ in range(sampled)],
                         response_message={"role": "assistant", "content": "Hello there. " * (sampled // 3)},
                         finish_reason="stop")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--per-round", type=int, default=200)
    args = ap.parse_args()
    stored = record_codec.zlib_stored
    ways = {"stored blocks (now)": stored, "zlib level 1 (before)": lambda data: zlib.compress(data, 1)}
    table = Table(title=f"record envelope: encode time per record and stored bytes ({args.rounds} alternating rounds)")
    for col in ("record", "envelope", "encode us p50", "ratio", "stored bytes", "bytes ratio"):
        table.add_column(col, justify="left" if col in ("record", "envelope") else "right")
    for name, rec in (("small chat call (16 sampled)", record("openai_chat", SMALL, 24, 16)),
                      ("82 KB Claude Code request (200 sampled)",
                       record("anthropic", replay_request(), 29280, 200))):
        known = record_codec.Encoder()
        record_codec.encode(rec, known)  # the session's chunks are stored: later calls refer to them
        times: dict[str, list[float]] = {way: [] for way in ways}
        sizes: dict[str, int] = {}
        try:
            for _ in range(args.rounds):
                for way, impl in ways.items():
                    record_codec.zlib_stored = impl  # type: ignore[assignment]
                    for _ in range(args.per_round):
                        t = time.process_time()
                        blob, _, _ = record_codec.encode(rec, record_codec.Encoder(set(known.used)))
                        times[way].append(time.process_time() - t)
                    sizes[way] = len(blob)
                    assert record_codec.decode(blob, known.chunks).completion_token_ids == rec.completion_token_ids
        finally:
            record_codec.zlib_stored = stored
        base_t = statistics.median(times["zlib level 1 (before)"])
        base_b = sizes["zlib level 1 (before)"]
        for way in ways:
            p50 = statistics.median(times[way])
            table.add_row(name, way, f"{p50 * 1e6:.1f}", f"{p50 / base_t:.2f}x", str(sizes[way]),
                          f"{sizes[way] / base_b:.2f}x")
    Console(width=150).print(table)


if __name__ == "__main__":
    main()
