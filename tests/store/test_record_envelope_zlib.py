"""A record's envelope is a zlib stream however it was written: stored (uncompressed) deflate
blocks when small (record_codec.zlib_stored: no deflate setup per call), compressed when large.
zlib itself reads both; the record decodes the same either way."""

from __future__ import annotations

import random
import zlib

from hypothesis import given, settings
from hypothesis import strategies as st

from polar_mq.store import codec as record_codec
from polar_mq.model import CaptureRecord


SIZES = st.one_of(st.integers(min_value=0, max_value=512),
                  st.builds(lambda k, d: max(0, 65535 * k + d), st.integers(1, 3), st.integers(-2, 2)))


@settings(max_examples=60, deadline=None)
@given(SIZES, st.integers(min_value=0, max_value=2 ** 32))
def test_stored_blocks_are_a_zlib_stream_of_the_data(size: int, seed: int) -> None:
    data = random.Random(seed).randbytes(size)  # around each 65,535-byte block boundary too
    stream = record_codec.zlib_stored(data)
    assert zlib.decompress(stream) == data
    reader = zlib.decompressobj()
    assert reader.decompress(stream) == data
    assert reader.eof and reader.unused_data == b""  # exactly one stream, its checksum included


def record(completion: int) -> CaptureRecord:
    return CaptureRecord(session_id="s-env", provider="openai_chat", stream=False, model_requested="m",
                         request={"messages": [{"role": "user", "content": "hi"}]},
                         messages=[{"role": "user", "content": "hi"}], prompt_token_ids=[1, 2, 3],
                         completion_token_ids=list(range(completion)),
                         completion_logprobs=[-0.5] * completion, response_message={"role": "assistant", "content": "x"})


def test_small_envelopes_are_stored_large_ones_compressed_and_both_decode() -> None:
    for completion, compressed in ((16, False), (4000, True)):
        rec = record(completion)
        blob, chunks, _ = record_codec.encode(rec)
        body = blob[len(record_codec.ENVELOPE_MAGIC):]
        packed = zlib.decompress(body)
        assert (len(packed) > record_codec.STORED_MAX) is compressed
        assert (body == record_codec.zlib_stored(packed)) is not compressed
        assert record_codec.decode(blob, chunks).to_dict() == rec.to_dict()
        assert record_codec.envelope(blob) is not None
