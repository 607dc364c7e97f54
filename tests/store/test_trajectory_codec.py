"""The stored trajectory layout (store/trajectory_codec.py) is lossless.

A hypothesis property builds trajectories whose traces form arbitrary chains (a trace continues an
earlier one's prompt + response), branches and forks (it shares only part of one), retries (the
same prompt again, another response) and unrelated traces, with values the compact forms must not
touch (bools in a loss mask, None logprobs, ids past uint32, unknown keys); decoding gives back a
dict that packs to the very same msgpack bytes (so `True` stays `True`, `1.0` stays `1.0`).
A delta whose parent is missing or later raises CorruptTrajectory, never a shorter id list.
"""

from __future__ import annotations

import random
import zlib
from unittest.mock import patch

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from polar_mq.model import Trace, Trajectory
from polar_mq.store import trajectory_codec as tc


def pack(obj):
    return msgpack.packb(obj, use_bin_type=True)


ids = st.lists(st.integers(0, 2 ** 32 - 1), max_size=40)
odd_ids = st.lists(st.one_of(st.integers(0, 2 ** 32 - 1), st.integers(2 ** 32, 2 ** 40), st.booleans()),
                   max_size=10)
floats = st.lists(st.floats(allow_nan=False, width=64), max_size=30)
messages = st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "tool"]),
                                           "content": st.text(max_size=20)}), max_size=4)


@st.composite
def trajectories(draw):
    traces: list[dict] = []
    pool_messages = draw(st.lists(messages, min_size=1, max_size=3))
    for _ in range(draw(st.integers(0, 9))):
        kind = draw(st.sampled_from(["new", "chain", "branch", "retry"])) if traces else "new"
        if kind == "new":
            prompt = draw(ids)
        else:
            parent = draw(st.sampled_from(traces))
            seq = parent["prompt_ids"] + parent["response_ids"]
            if not all(type(v) is int for v in seq):
                prompt = draw(ids)
            elif kind == "chain":
                prompt = seq + draw(ids)
            elif kind == "branch":  # shares only part of the parent's sequence (a fork)
                prompt = seq[:draw(st.integers(0, len(seq)))] + draw(ids)
            else:  # a retry: the same prompt again
                prompt = list(parent["prompt_ids"])
        if draw(st.integers(0, 9)) == 0:
            prompt = prompt + draw(odd_ids)  # not a uint32 array: stored as it is
        response = draw(ids)
        trace = Trace(prompt_ids=prompt, response_ids=response,
                      loss_mask=draw(st.one_of(st.just([1] * len(response)),
                                               st.lists(st.sampled_from([0, 1, True]), max_size=5))),
                      response_logprobs=draw(st.one_of(st.none(), floats,
                                                       st.lists(st.one_of(st.none(), st.floats()), max_size=3))),
                      messages=draw(st.sampled_from(pool_messages)) + draw(messages),
                      tools=draw(st.sampled_from([[], [{"type": "function", "function": {"name": "f"}}]])),
                      metadata=draw(st.sampled_from([{}, {"parent_trace": 0}]))).to_dict()
        if draw(st.booleans()):
            trace["added_later"] = draw(st.one_of(st.none(), st.integers(-2 ** 63, 2 ** 64 - 1), st.text(max_size=5)))
        traces.append(trace)
    traj = Trajectory(session_id="s", task_id="t", builder="per_request", stats={"calls": len(traces)},
                      metadata={"harness": "claude_code"}).to_dict()
    traj["traces"] = traces
    return traj


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trajectories())
def test_encode_decode_is_lossless(traj):
    # as configured, and compact whatever the size with deltas from 1 shared id (short traces)
    for min_shared, small in ((tc.MIN_SHARED, tc.SMALL), (1, 0)):
        with patch.object(tc, "MIN_SHARED", min_shared), patch.object(tc, "SMALL", small):
            blob = tc.encode_dict(traj)
        back = tc.decode_dict(blob)
        assert pack(back) == pack(traj)
        assert tc.packed(blob) == pack(traj)  # what the groups API splices in
        if small and len(pack(traj)) <= small:
            assert len(blob) <= len(pack(traj))
    # and the record type reads it the same
    assert pack(Trajectory.from_dict(tc.decode_dict(blob)).to_dict()) == pack(Trajectory.from_dict(traj).to_dict())


def test_generated_trajectories_do_use_deltas():
    """The property above is not vacuous: its chains, branches and retries make deltas."""
    kinds = []

    @settings(max_examples=60, deadline=None)
    @given(trajectories())
    def collect(traj):
        with patch.object(tc, "MIN_SHARED", 1), patch.object(tc, "SMALL", 0):
            env = msgpack.unpackb(zlib.decompress(tc.encode_dict(traj)[len(tc.MAGIC):]), raw=False)
        kinds.extend(t["prompt_ids"].code for t in env["t"]["traces"]
                     if isinstance(t["prompt_ids"], msgpack.ExtType))

    collect()
    assert kinds.count(tc.DELTA) >= 20 and kinds.count(tc.U32) >= 20


def test_chains_are_stored_as_deltas_and_shrink():
    base = list(range(1000, 3000))
    traces = []
    prompt = base
    for turn in range(20):
        response = [7, 8, 9, turn]
        traces.append(Trace(prompt_ids=list(prompt), response_ids=response, loss_mask=[1] * 4).to_dict())
        prompt = prompt + response + list(range(5000 + turn * 50, 5050 + turn * 50))
    traj = Trajectory(session_id="s", traces=[]).to_dict()
    traj["traces"] = traces
    blob = tc.encode_dict(traj)
    env = msgpack.unpackb(zlib.decompress(blob[len(tc.MAGIC):]), raw=False)
    kinds = [t["prompt_ids"].code for t in env["t"]["traces"]]
    assert kinds == [tc.U32] + [tc.DELTA] * 19
    for i, t in enumerate(env["t"]["traces"][1:], 1):
        parent, keep, tail = msgpack.unpackb(t["prompt_ids"].data, raw=False)
        assert parent == i - 1 and keep == len(traces[i - 1]["prompt_ids"]) + 4 and len(tail) == 50 * 4
    assert len(blob) * 20 < len(pack(traj))
    assert pack(tc.decode_dict(blob)) == pack(traj)


def _with_delta(parent: int, keep: int) -> bytes:
    """A stored value whose second trace's prompt ids are a delta of trace `parent`."""
    first = Trace(prompt_ids=list(range(100)), response_ids=[1, 2], loss_mask=[1, 1]).to_dict()
    second = Trace(prompt_ids=[], response_ids=[3], loss_mask=[1]).to_dict()
    t = {"session_id": "s", "traces": [
        {**first, "prompt_ids": msgpack.ExtType(tc.U32, b"".join(i.to_bytes(4, "little") for i in range(100))),
         "response_ids": msgpack.ExtType(tc.U32, b"\x01\0\0\0\x02\0\0\0"), "messages": [], "tools": msgpack.ExtType(tc.REF, pack(0))},
        {**second, "prompt_ids": msgpack.ExtType(tc.DELTA, pack([parent, keep, b"\x05\0\0\0"])),
         "messages": [], "tools": msgpack.ExtType(tc.REF, pack(0))}]}
    return tc.MAGIC + zlib.compress(pack({"v": tc.VERSION, "t": t, "m": [pack([])]}))


def test_decoded_traces_never_alias_each_other():
    """Traces that stored one message once get their own objects: changing one changes no other."""
    msg = {"role": "user", "content": "x" * 100}
    traj = Trajectory(session_id="s", traces=[Trace(list(range(300)), [1], [1], messages=[msg]),
                                              Trace(list(range(301)), [1], [1], messages=[msg])]).to_dict()
    a, b = tc.decode_dict(tc.encode_dict(traj))["traces"]
    a["messages"][0]["content"] = "changed"
    assert b["messages"][0]["content"] == "x" * 100


def test_a_delta_resolves_against_its_parent():
    back = tc.decode_dict(_with_delta(0, 101))
    assert back["traces"][1]["prompt_ids"] == list(range(100)) + [1, 5]


@pytest.mark.parametrize("parent, keep, says", [
    (1, 10, "delta of trace 1"),    # itself: not an earlier trace
    (5, 10, "delta of trace 5"),    # a trace that is not there (missing parent)
    (-1, 10, "delta of trace -1"),
    (0, 500, "keeps 500 ids of a 102-id parent"),
])
def test_missing_parent_raises_never_loses_ids(parent, keep, says):
    with pytest.raises(tc.CorruptTrajectory, match=says):
        tc.decode_dict(_with_delta(parent, keep))


def test_small_values_are_never_larger_than_plain():
    """Where zlib cannot win (a few random bytes), a small trajectory is stored plain."""
    noise = Trajectory(session_id="s", metadata={"n": random.Random(1).randbytes(300)}).to_dict()
    blob = tc.encode_dict(noise)
    assert len(blob) <= len(pack(noise)) and tc.decode_dict(blob) == noise
    assert not tc.is_encoded(blob)


def test_truncated_or_unknown_values_raise_clearly():
    blob = tc.encode_dict(Trajectory(session_id="s", traces=[Trace(list(range(5000)), [2], [1])]).to_dict())
    assert tc.is_encoded(blob)
    with pytest.raises(tc.CorruptTrajectory, match="cannot be read"):
        tc.decode_dict(blob[:-10])
    with pytest.raises(tc.CorruptTrajectory, match="version"):
        tc.decode_dict(tc.MAGIC + zlib.compress(pack({"v": 99, "t": {}, "m": []})))


def test_values_stored_before_this_layout_still_read():
    old = Trajectory(session_id="s", traces=[Trace([1, 2, 3], [4], [1], messages=[{"role": "user", "content": "x"}])])
    assert tc.decode_dict(pack(old.to_dict())) == old.to_dict()
