"""Record storage for long runs: each message / body chunk once per session, compressed, exact.

A Claude-Code-sized session (grown from the real Claude Code capture in tests/replays, see
bench/bench_storage.py) is written through the real GatewayStore into a real redis-server and
read back; its Redis bytes must stay within 3x its information, and what comes back must be
exactly what was written. The gateway end to end keeps serving the same calls (test_gateway and
test_replays cover GET /sessions/<id>/calls through the new layout).
"""

from __future__ import annotations

import importlib.util
import sys
import uuid
from pathlib import Path

import msgpack
import pytest
import redis

from polar_mq.store import codec as record_codec
from polar_mq.model import CaptureRecord
from polar_mq.store.core import GatewayStore, Keys

BENCH = Path(__file__).resolve().parents[2] / "bench" / "bench_storage.py"


def _bench():
    spec = importlib.util.spec_from_file_location("bench_storage", BENCH)
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("bench_storage", mod)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def bench():
    return _bench()


@pytest.fixture(scope="module")
def long_session(bench):
    sid = f"long-{uuid.uuid4().hex[:8]}"
    return sid, bench.claude_code_session(30, session_id=sid)


@pytest.fixture()
def store(redis_url) -> GatewayStore:
    return GatewayStore(redis.Redis.from_url(redis_url))


def session_bytes(r: redis.Redis, sid: str) -> int:
    keys = Keys()
    return sum(int(r.memory_usage(k, samples=0) or 0) for k in (keys.calls(sid), keys.call_chunks(sid)))


def test_long_session_round_trips_exactly_within_3x_information(store, long_session, bench):
    sid, records = long_session
    for rec in records:
        store.append_call(rec)
    back = store.calls(sid)
    assert [b.to_dict() for b in back] == [r.to_dict() for r in records]
    used = session_bytes(store.r, sid)
    info = bench.information_bytes(records)
    whole = sum(len(msgpack.packb(r.to_dict(), use_bin_type=True)) for r in records)
    assert used <= 3 * info, (used, info)
    assert used * 10 < whole  # quadratic before: whole records are > 10x the chunked layout here


def test_records_never_alias_each_other(store, long_session):
    sid, records = long_session
    sid2 = sid + "-alias"
    for rec in records[:3]:
        store.append_call(CaptureRecord.from_dict({**rec.to_dict(), "session_id": sid2}))
    a, b, _ = store.calls(sid2)
    a.messages[0]["content"] = "changed"
    assert b.messages[0]["content"] != "changed"


def test_whole_record_blobs_from_before_still_read(store):
    """Records written by the old layout (and spooled ones) decode unchanged next to new ones."""
    sid = f"old-{uuid.uuid4().hex[:8]}"
    old = CaptureRecord(session_id=sid, provider="openai_chat", started_at=1.0,
                        messages=[{"role": "user", "content": "x" * 500}], prompt_token_ids=list(range(600)))
    store.r.rpush(store.keys.calls(sid), msgpack.packb(old.to_dict(), use_bin_type=True))
    new = CaptureRecord(session_id=sid, provider="openai_chat", started_at=2.0,
                        messages=old.messages + [{"role": "assistant", "content": "y" * 300}],
                        prompt_token_ids=list(range(700)))
    store.append_call(new)
    assert [r.to_dict() for r in store.calls(sid)] == [old.to_dict(), new.to_dict()]


def test_chunks_collected_under_a_writer_are_written_again(store):
    """The writer skips chunks it stored before; if the session's chunk hash vanished meanwhile
    (gc), the next write notices inside its MULTI and stores them again: nothing is unreadable."""
    sid = f"gc-{uuid.uuid4().hex[:8]}"
    msgs = [{"role": "system", "content": "s" * 4000}, {"role": "user", "content": "u" * 3000}]
    first = CaptureRecord(session_id=sid, provider="openai_chat", started_at=1.0, messages=msgs,
                          prompt_token_ids=list(range(1000)))
    store.append_call(first)
    store.r.delete(store.keys.call_chunks(sid), store.keys.calls(sid))
    second = CaptureRecord(session_id=sid, provider="openai_chat", started_at=2.0,
                           messages=msgs + [{"role": "user", "content": "again"}],
                           prompt_token_ids=list(range(1100)))
    store.append_call(second)
    assert [r.to_dict() for r in store.calls(sid)] == [second.to_dict()]


def test_shared_prompt_prefix_shares_id_blocks():
    enc = record_codec.Encoder()
    a = CaptureRecord(session_id="s", provider="openai_chat", prompt_token_ids=list(range(2000)))
    b = CaptureRecord(session_id="s", provider="openai_chat", prompt_token_ids=list(range(2000)) + [7] * 300)
    record_codec.encode(a, enc)
    before = len(enc.chunks)
    record_codec.encode(b, enc)
    # b shares a's 7 full blocks (ids 0..1791); only its 8th block is new, its tail is inline.
    assert before == 2000 // record_codec.ID_BLOCK
    assert len(enc.chunks) - before == 1


def test_missing_chunk_is_a_clear_error():
    blob, chunks, _ = record_codec.encode(CaptureRecord(session_id="s", provider="anthropic",
                                                        messages=[{"role": "user", "content": "z" * 999}]))
    with pytest.raises(record_codec.MissingChunk):
        record_codec.decode(blob, {})
    assert record_codec.decode(blob, chunks).messages[0]["content"] == "z" * 999
