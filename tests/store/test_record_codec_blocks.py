"""Prompt-id blocks encoded through the process's block-digest cache (record_codec.BLOCKS) are
exactly what encoding without it gives, and a block first seen in another session is still
stored for this one."""

from __future__ import annotations

from polar_mq.store import codec as record_codec
from polar_mq.model import CaptureRecord


def record(session: str, ids: list[int]) -> CaptureRecord:
    return CaptureRecord(session_id=session, provider="openai_chat", stream=False, model_requested="m",
                         request={"messages": [{"role": "user", "content": "hi"}]},
                         messages=[{"role": "user", "content": "hi"}], prompt_token_ids=ids,
                         completion_token_ids=[1, 2], completion_logprobs=[-0.5, -0.25])


def encode_uncached(rec: CaptureRecord, known: set[bytes]) -> tuple[bytes, dict, set]:
    saved = record_codec.BLOCKS._map
    record_codec.BLOCKS._map = {}
    try:
        return record_codec.encode(rec, record_codec.Encoder(set(known)))
    finally:
        record_codec.BLOCKS._map = saved


def test_cached_blocks_encode_and_decode_exactly() -> None:
    first = list(range(50_000, 50_000 + 20_000))
    second = first + [7, 8, 9] * 300  # the next turn: same prefix, more ids
    stored: dict[bytes, bytes] = {}
    known: set[bytes] = set()
    for ids in (first, second, second):
        rec = record("s-cache", ids)
        expected = encode_uncached(rec, known)
        blob, chunks, used = record_codec.encode(rec, record_codec.Encoder(set(known)))
        assert (blob, chunks, used) == expected
        stored.update(chunks)
        known |= used
        assert record_codec.decode(blob, stored).prompt_token_ids == ids
    assert len(record_codec.BLOCKS._map) >= len(second) // record_codec.ID_BLOCK


def test_block_cached_from_another_session_is_stored_again() -> None:
    ids = list(range(90_000, 90_000 + 2_048))
    record_codec.encode(record("s-one", ids))  # fills the cache
    blob, chunks, used = record_codec.encode(record("s-two", ids), record_codec.Encoder(set()))
    assert used <= set(chunks)  # nothing known for s-two: every block it refers to is in the write
    assert record_codec.decode(blob, chunks).prompt_token_ids == ids


def test_ids_beyond_uint32_take_the_plain_way() -> None:
    ids = [2 ** 40 + i for i in range(600)] + [-1]
    blob, chunks, _ = record_codec.encode(record("s-big", ids))
    assert record_codec.decode(blob, chunks).prompt_token_ids == ids
