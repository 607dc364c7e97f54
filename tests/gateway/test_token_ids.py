"""Prompt ids kept as the upstream's JSON text (polar_mq/_io/token_ids.py): the first stream chunk's
`prompt_token_ids` is cut out before parsing (vllm_wire.load_answer), counted from its
commas, stored as blocks of its text (record_codec.Encoder.text_ids), and equal everywhere to the
list an ordinary parse gives."""

from __future__ import annotations

import json
import random

import orjson
import pytest

from polar_mq.store import codec as record_codec
from polar_mq.model import CaptureRecord
from polar_mq.proxy_app import fastjson
from polar_mq.proxy_app.upstream.pool import UpstreamStream
from polar_mq.proxy_app.upstream.vllm_wire import StreamAccumulator, load_answer
from polar_mq._io.token_ids import NUMPY_FROM, TokenIds


def text_of(ids: list[int]) -> bytes:
    return json.dumps(ids, separators=(",", ":"))[1:-1].encode()


@pytest.mark.parametrize("ids", [[], [0], [7, 151643], list(range(1000)),
                                 [random.Random(3).randrange(0, 200_000) for _ in range(5000)]])
def test_text_ids_count_and_equal_the_parsed_list(ids):
    tid = TokenIds.from_array_text(text_of(ids))
    assert tid is not None
    assert len(tid) == len(ids) and bool(tid) == bool(ids)
    assert tid == ids and ids == tid and tid.to_list() == ids and list(tid) == ids
    if ids:
        assert tid[0] == ids[0] and tid[-1] == ids[-1] and tid[1:3] == ids[1:3]
    assert tid != ids + [1]


@pytest.mark.parametrize("text", [b"1,,2", b",1", b"1,", b"1 2", b"1, 2", b" 1", b"-1,2", b"1.5", b"1e3",
                                  b"null", b'"1"', b"[1]", b"1,2\n"])
def test_anything_but_compact_non_negative_ints_is_left_to_the_parser(text):
    assert TokenIds.from_array_text(text) is None
    # the same behind 10 KB of good ids: past NUMPY_FROM the checks are numpy's, not the stdlib's
    long = b"1," * 5000
    assert len(long) >= NUMPY_FROM and TokenIds.from_array_text(long + b"1") is not None
    assert TokenIds.from_array_text(long + text) is None


def chunk(ids: list[int], where: str = "top", separators=(",", ":")) -> bytes:
    body: dict = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m",
                  "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                               "logprobs": None, "finish_reason": None}]}
    if where == "top":
        body["prompt_token_ids"] = ids
    else:
        body["choices"][0]["prompt_token_ids"] = ids
    return json.dumps(body, separators=separators).encode()


@pytest.mark.parametrize("where", ["top", "choice"])
def test_first_chunk_keeps_prompt_ids_as_text_and_everything_else_as_parsed(where):
    ids = list(range(100, 400))
    data = chunk(ids, where)
    got = load_answer(data, fastjson.loads)
    holder = got if where == "top" else got["choices"][0]
    assert isinstance(holder["prompt_token_ids"], TokenIds)
    assert holder["prompt_token_ids"] == ids
    assert {**got, **({"prompt_token_ids": ids} if where == "top" else {})} == {
        **orjson.loads(data), **({"prompt_token_ids": ids} if where == "top" else {})}
    if where == "choice":
        assert got["choices"][0]["delta"] == {"role": "assistant", "content": ""}


def test_first_chunk_without_plain_ids_parses_as_before():
    for data in (chunk([1, 2], separators=(", ", ": ")), chunk([]).replace(b"[]", b"null"),
                 b'{"choices":[],"usage":{"prompt_tokens":3}}',
                 # the key's text inside content is escaped, so it is never cut
                 json.dumps({"choices": [{"delta": {"content": '"prompt_token_ids":[1,2]'}}]}).encode()):
        got = load_answer(data, fastjson.loads)
        assert got == orjson.loads(data)
        assert not any(isinstance(v, TokenIds) for v in got.values())


def test_a_stream_accumulates_text_ids_into_its_result():
    ids = list(range(5000, 5300))
    acc = StreamAccumulator()
    acc.feed(load_answer(chunk(ids), fastjson.loads))
    acc.feed({"choices": [{"index": 0, "delta": {"content": "hi"}, "token_ids": [9], "finish_reason": "stop",
                           "logprobs": {"content": [{"token": "hi", "logprob": -0.5}]}}]})
    result = acc.result()
    assert isinstance(result.prompt_token_ids, TokenIds) and result.prompt_token_ids == ids


def record(session: str, ids) -> CaptureRecord:
    return CaptureRecord(session_id=session, provider="openai_chat", messages=[{"role": "user", "content": "x"}],
                         prompt_token_ids=ids, completion_token_ids=[1], completion_logprobs=[-0.1])


def test_text_ids_store_as_shared_blocks_and_decode_to_the_list():
    rng = random.Random(5)
    first = [rng.randrange(0, 150_000) for _ in range(20_000)]
    second = first + [rng.randrange(0, 150_000) for _ in range(700)]
    stored: dict[bytes, bytes] = {}
    known: set[bytes] = set()
    new_per_call = []
    for ids in (first, second, second):
        rec = record("s-text-ids", TokenIds.from_array_text(text_of(ids)))
        blob, chunks, used = record_codec.encode(rec, record_codec.Encoder(set(known)))
        new_per_call.append(len(chunks))
        stored.update(chunks)
        known |= used
        back = record_codec.decode(blob, stored)
        assert back.prompt_token_ids == ids and type(back.prompt_token_ids) is list
        # the same record with a list decodes to the same
        blob2, chunks2, _ = record_codec.encode(record("s-text-ids", ids), record_codec.Encoder(set()))
        assert record_codec.decode(blob2, chunks2).prompt_token_ids == ids
    # the second call stores only the blocks past the shared prefix; the third nothing new
    assert new_per_call[0] > 50 and new_per_call[1] <= 6 and new_per_call[2] == 0


def test_text_id_groups_are_reused_only_where_the_session_stored_them():
    """Whole blocks are looked up TEXT_GROUP at a time (record_codec.Encoder.text_ids): another
    session gets every chunk stored for it, and a prompt changed inside a group stores new blocks
    only from the change on; every record decodes to its ids."""
    rng = random.Random(11)
    ids = [rng.randrange(0, 150_000) for _ in range(30_000)]
    group_bytes = record_codec.TEXT_BLOCK * record_codec.TEXT_GROUP
    assert len(text_of(ids)) > 4 * group_bytes
    changed = list(ids)
    changed[len(changed) // 2] += 1  # inside a group past the first ones
    stored: dict[bytes, bytes] = {}
    known: set[bytes] = set()

    def encode(session: str, prompt: list[int], known: set[bytes]) -> tuple[int, set[bytes]]:
        rec = record(session, TokenIds.from_array_text(text_of(prompt)))
        blob, chunks, used = record_codec.encode(rec, record_codec.Encoder(set(known)))
        stored.update(chunks)
        assert record_codec.decode(blob, {**stored, **chunks}).prompt_token_ids == prompt
        assert used <= set(stored), "a record refers to a chunk that was never stored"
        return len(chunks), used

    first, known = encode("s-a", ids, known)
    again, _ = encode("s-a", ids, known)
    other, other_used = encode("s-b", ids, set())  # groups known to the process, not to s-b
    edited, _ = encode("s-a", changed, known)
    assert first > 60 and again == 0
    assert other == first and other_used == known
    assert 0 < edited <= first // 2 + 2


def test_to_dict_gives_plain_lists_and_equality_holds():
    ids = list(range(40))
    rec = record("s", TokenIds.from_array_text(text_of(ids)))
    same = CaptureRecord.from_dict({**rec.to_dict(), "prompt_token_ids": ids})
    assert type(rec.to_dict()["prompt_token_ids"]) is list
    assert rec.to_dict() == same.to_dict()
    assert rec == same
    assert isinstance(rec.to_dict(text_ids=True)["prompt_token_ids"], TokenIds)


class _Raw:
    """A response body that arrives in pieces (what the upstream socket gives)."""

    def __init__(self, data: bytes, piece: int):
        self.parts = [data[i:i + piece] for i in range(0, len(data), piece)]

    def read1(self, n: int) -> bytes:
        return self.parts.pop(0) if self.parts else b""


class _Resp:
    """A streamed answer with the `transports.Reply` surface a stream reads (no idle mode)."""

    can_idle = False

    def __init__(self, data: bytes, piece: int):
        self._raw = _Raw(data, piece)

    def read1(self, n: int = 65536) -> bytes:
        return self._raw.read1(n)

    def arrived(self) -> bool:
        return False

    def close(self) -> None:
        pass


@pytest.mark.parametrize("piece", [7, 4096, 1 << 20])
def test_an_upstream_stream_cuts_the_first_chunk_only(piece):
    ids = list(range(3000))
    body = (b"data: " + chunk(ids) + b"\n\n"
            + b'data: {"choices":[{"index":0,"delta":{"content":"a"},"token_ids":[5]}],"prompt_token_ids":[1,2]}\n\n'
            + b"data: [DONE]\n\n")
    stream = UpstreamStream(_Resp(body, piece), "http://up")  # type: ignore[arg-type]
    first = stream.start()
    assert isinstance(first["prompt_token_ids"], TokenIds) and first["prompt_token_ids"] == ids
    rest = list(stream.chunks())[1:]
    assert rest[0]["prompt_token_ids"] == [1, 2] and type(rest[0]["prompt_token_ids"]) is list
    assert stream.done


from hypothesis import given, settings, strategies as st  # noqa: E402

_ids = st.lists(st.integers(min_value=0, max_value=2 ** 70), max_size=300)  # past 64 bits: orjson's floats
_text = st.text(alphabet=st.sampled_from(list('ab"\\[],: {}prompt_token_ids0123')), max_size=40)


@settings(max_examples=300, deadline=None)
@given(ids=_ids, content=_text,
       where=st.sampled_from(["top", "choice", "both", "none", "top null", "nested", "nested, choice null"]),
       spaced=st.booleans(), extra_key=_text)
def test_fuzz_first_chunk_parses_exactly_as_orjson(ids, content, where, spaced, extra_key):
    """Whatever the chunk (ids anywhere or nowhere, a null `prompt_token_ids` where the ids are
    looked for while the array sits elsewhere, strings that quote the key, Python's spacing),
    load_answer gives what orjson gives, with at most the prompt ids as an equal TokenIds."""
    body: dict = {"id": "c", extra_key: content,
                  "choices": [{"index": 0, "delta": {"content": content}, "finish_reason": None}]}
    if where in ("top", "both"):
        body["prompt_token_ids"] = ids
    if where in ("choice", "both", "top null"):
        body["choices"][0]["prompt_token_ids"] = ids
    if where == "top null":
        body["prompt_token_ids"] = None
    if where.startswith("nested"):
        body["choices"][0]["delta"]["prompt_token_ids"] = ids
    if where == "nested, choice null":
        body["choices"][0]["prompt_token_ids"] = None
    data = json.dumps(body, separators=(", ", ": ") if spaced else (",", ":")).encode()
    got = load_answer(data, fastjson.loads)
    assert got == orjson.loads(data)  # a TokenIds equals the list it stands for
    if spaced and len(ids) > 1:  # only the compact form (vLLM's) takes the text path
        assert not any(isinstance(v, TokenIds) for v in (got, *got["choices"]) for v in v.values())
    for holder in (got, *got["choices"]):
        ids_value = holder.get("prompt_token_ids")
        if isinstance(ids_value, TokenIds):
            assert len(ids_value) == len(ids) and list(ids_value) == orjson.loads(orjson.dumps(ids) if max(ids, default=0) < 2 ** 64 else json.dumps(ids).encode())
