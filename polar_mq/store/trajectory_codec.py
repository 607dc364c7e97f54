"""How a finished session's Trajectory is stored in Redis: prompt ids as deltas of a parent trace.

A trajectory repeats its session's conversation once per trace: with the per_request builder
every call's trace carries the whole prompt so far (its ids, its messages, the tools), and
prefix_merging's branches repeat their common prefix. Stored as plain msgpack, a 30-call
Claude-Code-shaped session's result took 1.4x (prefix_merging) to 17x (per_request) its
information (bench/bench_storage.py), on top of its gateway records. Here the stored value is:

- `MAGIC` + zlib of a msgpack map {"v": 1, "t": trajectory dict, "m": [packed values]} where
  the trajectory dict is `Trajectory.to_dict()` with, in each trace:
  - `prompt_ids` as `ExtType(DELTA, [parent, keep, tail])`: the first `keep` ids of the parent
    trace's sequence (its prompt ids then its response ids) followed by `tail` — the parent is an
    EARLIER trace of the same stored value (the longest common prefix among the `PARENTS`
    traces before it), so it can never be missing or expire on its own: a value decodes whole or
    raises `CorruptTrajectory` (never a shorter id list). Without a useful parent (shared prefix
    under `MIN_SHARED` ids) the ids are stored whole;
  - integer lists (ids, loss masks) as `ExtType(U32, little-endian uint32)` and float lists
    (logprobs) as `ExtType(F64, little-endian float64)`: exact, every value's type kept (a list
    with anything else — bool, None, a big int — stays as it was);
  - each message and the tools list as `ExtType(REF, index)` into "m", each distinct value packed
    once per trajectory.
  Every other key (and key order) is kept as it is, so fields added to Trace later round-trip.
- Values written before this layout (plain msgpack, which never starts with 0xc1) decode as ever,
  and a small trajectory whose plain msgpack is no larger than the compact value is stored plain.

`decode(encode(d)) == d` for every trajectory dict, byte-identical when packed again
(tests/store/test_trajectory_codec.py: a hypothesis property over chains, branches, forks and
retries; the bench session through every reader in tests/store/test_trajectory_storage.py).
`PipelineStore.save_trajectory / get_trajectory / trajectory_blobs` are its only users: every
reader (API, groups, viewer, exports, client) gets full prompt ids through them.
"""

from __future__ import annotations

import struct
import sys
import zlib
from array import array
from typing import Any

import msgpack

MAGIC = b"\xc1\x02"  # 0xc1 is never used by msgpack: a plain msgpack value never starts so
VERSION = 1
U32, F64, DELTA, REF = 1, 2, 3, 4  # msgpack ext type codes
PARENTS = 8  # earlier traces compared as a trace's parent (the nearest first)
MIN_SHARED = 64  # ids a parent must share for a delta to be worth its reference
SMALL = 4096  # compact values up to this size are stored plain when that is no larger
_LITTLE = sys.byteorder == "little"
_FLOAT_FIELDS = ("response_logprobs",)


class CorruptTrajectory(ValueError):
    """A stored trajectory that cannot be decoded whole (a delta naming no earlier trace, a bad
    reference, a truncated value): raised rather than returning ids that are not the ones stored."""


def _u32(values: list[Any]) -> bytes | None:
    """Little-endian uint32 bytes of a list of plain ints in range, else None."""
    for v in values:
        if type(v) is not int:
            return None
    try:
        arr = array("I", values)
    except OverflowError:
        return None
    if arr.itemsize != 4:  # pragma: no cover - every platform polar_mq runs on has 4-byte "I"
        return None
    if not _LITTLE:  # pragma: no cover
        arr.byteswap()
    return arr.tobytes()


def _from_u32(data: bytes) -> list[int]:
    if len(data) % 4:
        raise CorruptTrajectory("an id array is not a whole number of uint32")
    arr = array("I")
    arr.frombytes(data)
    if not _LITTLE:  # pragma: no cover
        arr.byteswap()
    return arr.tolist()


def _f64(values: list[Any]) -> bytes | None:
    for v in values:
        if type(v) is not float:
            return None
    return struct.pack(f"<{len(values)}d", *values)


def _from_f64(data: bytes) -> list[float]:
    if len(data) % 8:
        raise CorruptTrajectory("a float array is not a whole number of float64")
    return list(struct.unpack(f"<{len(data) // 8}d", data))


def _shared(a: bytes, b: bytes) -> int:
    """Ids (uint32 each) the two arrays share from the start: binary search on memcmp (prefix
    equality is monotone; `startswith` of a memoryview compares without copying), so a 50k-id
    comparison costs a few dozen C compares."""
    lo, hi = 0, min(len(a), len(b)) // 4
    view = memoryview(a)
    if b.startswith(view[:hi * 4]):
        return hi
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if b.startswith(view[:mid * 4]):
            lo = mid
        else:
            hi = mid - 1
    return lo


class _Values:
    """Distinct packed values (messages, tools lists) of one trajectory, each once."""

    def __init__(self) -> None:
        self.packed: list[bytes] = []
        self.index: dict[bytes, int] = {}

    def ref(self, value: Any) -> msgpack.ExtType:
        packed = msgpack.packb(value, use_bin_type=True)
        i = self.index.get(packed)
        if i is None:
            i = self.index[packed] = len(self.packed)
            self.packed.append(packed)
        return msgpack.ExtType(REF, msgpack.packb(i))


def _encode_trace(trace: dict[str, Any], sequences: list[bytes | None], values: _Values) -> dict[str, Any]:
    out = dict(trace)  # same keys, same order
    prompt = trace.get("prompt_ids")
    prompt_raw = _u32(prompt) if isinstance(prompt, list) else None
    response = trace.get("response_ids")
    response_raw = _u32(response) if isinstance(response, list) else None
    if prompt_raw is not None:
        best, keep = -1, 0
        me = len(sequences)
        for j in range(me - 1, max(-1, me - 1 - PARENTS), -1):
            seq = sequences[j]
            if seq is None:
                continue
            n = _shared(seq, prompt_raw)
            if n > keep:
                best, keep = j, n
        if best >= 0 and keep >= MIN_SHARED:
            out["prompt_ids"] = msgpack.ExtType(DELTA, msgpack.packb([best, keep, prompt_raw[keep * 4:]],
                                                                      use_bin_type=True))
        else:
            out["prompt_ids"] = msgpack.ExtType(U32, prompt_raw)
    sequences.append(prompt_raw + response_raw if prompt_raw is not None and response_raw is not None else None)
    for name in ("response_ids", "loss_mask"):
        v = trace.get(name)
        raw = _u32(v) if isinstance(v, list) else None
        if raw is not None:
            out[name] = msgpack.ExtType(U32, raw)
    for name in _FLOAT_FIELDS:
        v = trace.get(name)
        raw = _f64(v) if isinstance(v, list) else None
        if raw is not None:
            out[name] = msgpack.ExtType(F64, raw)
    msgs = trace.get("messages")
    if isinstance(msgs, list):
        out["messages"] = [values.ref(m) for m in msgs]
    if "tools" in trace:
        out["tools"] = values.ref(trace["tools"])
    return out


def encode_dict(traj: dict[str, Any]) -> bytes:
    """The stored value of a trajectory dict (`Trajectory.to_dict()`)."""
    values = _Values()
    out = dict(traj)
    traces = traj.get("traces")
    if isinstance(traces, list):
        sequences: list[bytes | None] = []
        out["traces"] = [_encode_trace(t, sequences, values) if isinstance(t, dict) else t for t in traces]
    packed = msgpack.packb({"v": VERSION, "t": out, "m": values.packed}, use_bin_type=True)
    blob = MAGIC + zlib.compress(packed, 6)
    if len(blob) <= SMALL:  # a few traces of a short session: the plain value may be smaller
        plain: bytes = msgpack.packb(traj, use_bin_type=True)
        if len(plain) <= len(blob):
            return plain
    return blob


def is_encoded(blob: bytes) -> bool:
    return blob[:len(MAGIC)] == MAGIC


def decode_dict(blob: bytes, shared: bool = False) -> dict[str, Any]:
    """The trajectory dict a stored value holds (either layout). Raises CorruptTrajectory when
    the value cannot be decoded whole. `shared`: traces may share (alias) equal message and
    tools objects, each unpacked once; only for a caller that packs the dict at once
    (`packed`), never one that hands it on to be changed."""
    if not is_encoded(blob):
        plain: dict[str, Any] = msgpack.unpackb(blob, raw=False, strict_map_key=False)
        return plain
    try:
        env = msgpack.unpackb(zlib.decompress(blob[len(MAGIC):]), raw=False, strict_map_key=False)
    except (zlib.error, ValueError, msgpack.UnpackException) as exc:
        raise CorruptTrajectory(f"stored trajectory cannot be read: {exc}") from exc
    if not isinstance(env, dict) or env.get("v") != VERSION:
        raise CorruptTrajectory(f"unknown stored trajectory version {env.get('v') if isinstance(env, dict) else env!r}")
    table = _Table(env.get("m") or [], shared)
    traj: dict[str, Any] = env["t"]
    traces = traj.get("traces")
    if isinstance(traces, list):
        sequences: list[list[int] | None] = []
        traj["traces"] = [_decode_trace(t, sequences, table) if isinstance(t, dict) else t for t in traces]
    return traj


def packed(blob: bytes) -> bytes:
    """The msgpack of the trajectory dict a stored value holds (what the groups API splices into
    its answer): a plain value as it is, a compact one decoded and packed."""
    if not is_encoded(blob):
        return blob
    out: bytes = msgpack.packb(decode_dict(blob, shared=True), use_bin_type=True)
    return out


class _Table:
    """The distinct values of one stored trajectory, unpacked per use (no aliasing) or, when
    `shared`, once."""

    def __init__(self, values: list[bytes], shared: bool):
        self.values = values
        self.cache: dict[int, Any] | None = {} if shared else None

    def __call__(self, ext: Any) -> Any:
        if not isinstance(ext, msgpack.ExtType) or ext.code != REF:
            raise CorruptTrajectory("a message or tools entry is not a reference")
        i = msgpack.unpackb(ext.data)
        if not isinstance(i, int) or not 0 <= i < len(self.values):
            raise CorruptTrajectory(f"reference {i!r} outside the trajectory's {len(self.values)} values")
        if self.cache is None:
            return msgpack.unpackb(self.values[i], raw=False, strict_map_key=False)
        if i not in self.cache:
            self.cache[i] = msgpack.unpackb(self.values[i], raw=False, strict_map_key=False)
        return self.cache[i]


def _ints(v: Any) -> Any:
    if isinstance(v, msgpack.ExtType):
        if v.code != U32:
            raise CorruptTrajectory(f"unexpected ext type {v.code} for an id list")
        return _from_u32(v.data)
    return v


def _decode_trace(trace: dict[str, Any], sequences: list[list[int] | None], table: _Table) -> dict[str, Any]:
    prompt = trace.get("prompt_ids")
    me = len(sequences)
    if isinstance(prompt, msgpack.ExtType) and prompt.code == DELTA:
        try:
            parent, keep, tail = msgpack.unpackb(prompt.data, raw=False)
        except (ValueError, TypeError, msgpack.UnpackException) as exc:
            raise CorruptTrajectory(f"trace {me}: unreadable prompt delta") from exc
        base = sequences[parent] if isinstance(parent, int) and 0 <= parent < me else None
        if base is None:
            raise CorruptTrajectory(f"trace {me}: prompt ids are a delta of trace {parent!r}, "
                                    "which is not an earlier trace with ids")
        if not isinstance(keep, int) or not 0 <= keep <= len(base):
            raise CorruptTrajectory(f"trace {me}: keeps {keep!r} ids of a {len(base)}-id parent")
        if not isinstance(tail, bytes):
            raise CorruptTrajectory(f"trace {me}: the new ids of a prompt delta are not an id array")
        trace["prompt_ids"] = base[:keep] + _from_u32(tail)
    else:
        trace["prompt_ids"] = _ints(prompt)
    response = trace.get("response_ids")
    for name in ("response_ids", "loss_mask"):
        if name in trace:
            trace[name] = _ints(trace[name])
    for name in _FLOAT_FIELDS:
        v = trace.get(name)
        if isinstance(v, msgpack.ExtType):
            if v.code != F64:
                raise CorruptTrajectory(f"unexpected ext type {v.code} for {name}")
            trace[name] = _from_f64(v.data)
    # the encoder kept a sequence exactly where both lists were uint32 arrays
    coded = isinstance(prompt, msgpack.ExtType) and isinstance(response, msgpack.ExtType)
    sequences.append(trace["prompt_ids"] + trace["response_ids"] if coded else None)
    if isinstance(trace.get("messages"), list):
        trace["messages"] = [table(m) for m in trace["messages"]]
    if "tools" in trace:
        trace["tools"] = table(trace["tools"])
    return trace

