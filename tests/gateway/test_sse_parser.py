"""vllm_wire.SseParser gives the same payloads however the upstream's bytes are cut into reads."""

from __future__ import annotations

import random

from polar_mq.proxy_app.upstream.vllm_wire import SseParser


def test_payloads_independent_of_read_boundaries() -> None:
    rng = random.Random(7)
    events = [b'{"i": %d, "x": "%s"}' % (i, b"y" * rng.randint(0, 300)) for i in range(200)]
    events.append(b'{"prompt_token_ids": [%s]}' % b",".join(b"%d" % i for i in range(20_000)))
    wire = b"".join(b": ping\r\n\r\nevent: e\ndata: " + e + b"\r\n\r\n" if i % 3 == 0 else
                    b"data:" + e + b"\ndata: more\n\n" for i, e in enumerate(events))
    expected = [e if i % 3 == 0 else e + b"\nmore" for i, e in enumerate(events)]
    for _ in range(50):
        parser, got, pos = SseParser(), [], 0
        while pos < len(wire):
            n = rng.choice([1, 7, 300, 4096, 65536])
            got.extend(parser.feed(wire[pos:pos + n]))
            pos += n
        got.extend(parser.end())
        assert got == expected


def test_last_payload_without_blank_line_counts_at_the_end() -> None:
    parser = SseParser()
    assert list(parser.feed(b"data: [DONE]\n")) == []
    assert list(parser.end()) == [b"[DONE]"]
