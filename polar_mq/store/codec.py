"""How a CaptureRecord is laid out in Redis: every message and body chunk once per session.

An agent session re-sends its whole conversation on every call, so storing each record whole
makes a session's storage quadratic in its turns (a 30-turn session took 21x its information).
Here a record becomes an *envelope* plus *chunks*:

- chunks are content-addressed (the first 12 bytes of the SHA-256 of their msgpack bytes; records
  written with BLAKE2b digests decode the same: a digest is only a key) and stored once
  per session in one Redis hash, each zlib-compressed when that is smaller;
- the envelope keeps the record's small fields inline and a digest (msgpack `bin`, which JSON
  data never contains, so a `bytes` value is always a reference) where a chunk was:
  each normalised message, the normalised tools, the response message, each element of every
  list in the provider request body (Anthropic `messages` / `system`, OpenAI `messages` /
  `input`, Gemini `contents`...) and every other large request field (`tools` whole);
- prompt token ids are cut into blocks of `ID_BLOCK` ids aligned at position 0, so the shared
  prefix of consecutive calls (the conversation so far) shares its blocks; the last partial
  block stays inline. Sampled ids and logprobs stay inline (they are unique to a call).

Decoding gives back exactly the record that was encoded; `GET /sessions/<id>/calls` is unchanged.

Tests: tests/store/test_record_codec_blocks.py, tests/store/test_record_envelope_zlib.py,
tests/store/test_storage.py.
"""

from __future__ import annotations

import hashlib
import struct
import zlib
from array import array
from typing import Any, Callable

import msgpack

from polar_mq._io.locks import short_lock
from polar_mq.model import CaptureRecord
from polar_mq._io.token_ids import TokenIds, parse_ids

ID_BLOCK = 256  # prompt ids per shared block
TEXT_BLOCK = 1536  # bytes of id text per shared block of a TokenIds (~256 ids of 5 digits)
TEXT_GROUP = 16  # whole text blocks looked up together (Encoder.text_ids)
INLINE_MAX = 48  # packed values up to this size stay in the envelope (a reference costs ~14 B)
ENVELOPE_MAGIC = b"\xc1\x01"  # 0xc1 is never used by msgpack: old whole-record blobs never start so
_RAW, _ZLIB = b"m", b"z"

Chunks = dict[bytes, bytes]  # digest -> stored (maybe compressed) bytes


DIGEST = 12  # bytes of a chunk's content address


def digest(data: bytes | memoryview, size: int = DIGEST) -> bytes:
    """A content address: SHA-256, truncated. Why not BLAKE2b: OpenSSL's SHA-256 runs on the
    CPU's SHA extensions (x86 SHA-NI, ARMv8 crypto), about twice as fast, and the gateway hashes
    every large request value and the whole prompt's ids on each call."""
    return hashlib.sha256(data).digest()[:size]


class BlockDigests:
    """Digests of prompt-id blocks this process encoded, keyed by a 128-bit digest of the block's
    raw uint32 bytes. Every call of a session re-sends the conversation so far, so its prompt
    ids repeat the blocks of the call before: packing and hashing each 256-id block again costs
    in proportion to the prompt, while hashing the raw bytes is about ten times cheaper. The key
    is a cryptographic hash of the exact ids, so a hit names the same chunk bytes; bounded
    (cleared when full: ~200 B per entry; tests/store/test_record_codec_blocks.py)."""

    def __init__(self, max_entries: int = 32768):
        self.max_entries = max_entries
        self._map: dict[bytes, bytes] = {}
        self._lock = short_lock()

    def get(self, key: bytes) -> bytes | None:
        return self._map.get(key)

    def put(self, key: bytes, digest: bytes) -> None:
        with self._lock:
            if len(self._map) >= self.max_entries:
                self._map.clear()
            self._map[key] = digest


BLOCKS = BlockDigests()


class RepeatedValues:
    """Digests of the large values a harness re-sends unchanged on every call: its tool
    definitions (Claude Code: 64 KB, stored as sent and as normalised). Comparing the packed
    bytes with the last few such values costs a fraction of hashing them twice per call. Keyed
    by the exact packed bytes (what the digest is
    of), compared by length then bytes (hashing a 64 KB key for a dict costs more than that). The
    very object seen before (bodies that share a known value: proxy_app/fastjson.KnownValues) is
    found without packing it: records never change after capture, and an entry holds its object,
    so its id cannot name another."""

    def __init__(self, max_entries: int = 16):
        self.max_entries = max_entries
        self._entries: list[tuple[bytes, bytes, Any]] = []  # (packed, digest, object), most recent first
        self._lock = short_lock()

    def same(self, value: Any) -> tuple[bytes, bytes] | None:
        """(packed, digest) of this very object, if it was digested here."""
        with self._lock:
            for packed, ref, obj in self._entries:
                if obj is value:
                    return packed, ref
        return None

    def digest(self, packed: bytes, value: Any = None) -> bytes:
        n = len(packed)
        with self._lock:
            for i, (seen, ref, _) in enumerate(self._entries):
                if len(seen) == n and seen == packed:
                    del self._entries[i]
                    self._entries.insert(0, (seen, ref, value))  # the latest object with these bytes
                    return ref
        ref = digest(packed)
        with self._lock:
            self._entries.insert(0, (packed, ref, value))
            del self._entries[self.max_entries:]
        return ref


REPEATED = RepeatedValues()


def _pack(obj: Any) -> bytes:
    packed: bytes = msgpack.packb(obj, use_bin_type=True)
    return packed


def _unpack(blob: bytes) -> Any:
    return msgpack.unpackb(blob, raw=False, strict_map_key=False)


def compress(packed: bytes) -> bytes:
    """A stored chunk: zlib when it saves space, else the msgpack bytes as they are."""
    z = zlib.compress(packed, 6)
    return _ZLIB + z if len(z) + 1 < len(packed) + 1 else _RAW + packed


def decompress(stored: bytes) -> bytes:
    return zlib.decompress(stored[1:]) if stored[:1] == _ZLIB else stored[1:]


class Encoder:
    """Turns records into envelopes, collecting the chunks they refer to. Digests in `known`
    (chunks this writer already stored for the session) are referenced without compressing them
    again: compression of the whole conversation on every call would dominate the write."""

    def __init__(self, known: set[bytes] | frozenset[bytes] = frozenset()) -> None:
        self.chunks: Chunks = {}
        self.known = known
        self.used: set[bytes] = set()

    def ref(self, value: Any, repeated: bool = False) -> Any:
        """A digest for a value worth sharing; small values stay inline. `repeated`: a large value
        that calls tend to repeat unchanged (tool definitions), whose digest REPEATED may know."""
        known = REPEATED.same(value) if repeated else None
        if known is not None:
            packed, ref = known
        else:
            packed = _pack(value)
            if len(packed) <= INLINE_MAX:
                return value
            ref = REPEATED.digest(packed, value) if repeated else digest(packed)
        self.used.add(ref)
        if ref not in self.chunks and ref not in self.known:
            self.chunks[ref] = compress(packed)
        return ref

    def refs(self, values: list[Any]) -> list[Any]:
        return [self.ref(v) for v in values]

    def ids(self, ids: list[int]) -> list[Any]:
        """Prompt ids as shared blocks (aligned at 0) and an inline tail. A block whose digest
        this process knows (BLOCKS) and whose chunk is stored for this session is referenced
        without packing it again."""
        full = len(ids) - len(ids) % ID_BLOCK
        try:
            raw: memoryview | None = memoryview(array("I", ids[:full]).tobytes())
        except (OverflowError, TypeError):  # not uint32 token ids: the plain way
            raw = None
        out: list[Any] = []
        step = ID_BLOCK * 4
        for n, i in enumerate(range(0, full, ID_BLOCK)):
            if raw is None:
                out.append(self.ref(ids[i:i + ID_BLOCK]))
            else:
                out.append(self._block(digest(raw[n * step:(n + 1) * step], 16),
                                       lambda: ids[i:i + ID_BLOCK]))
        out.extend(ids[full:])
        return out

    def _block(self, key: bytes, ids_of: Callable[[], list[int]]) -> Any:
        """One prompt-id block by its BLOCKS key: the digest this process stored for the session
        before, without building the ids again; else `ids_of()` (called at once) referenced and
        remembered."""
        known = BLOCKS.get(key)
        if known is not None and (known in self.known or known in self.chunks):
            self.used.add(known)
            return known
        ref = self.ref(ids_of())
        if isinstance(ref, bytes):
            BLOCKS.put(key, ref)
        return ref

    def text_ids(self, ids: TokenIds) -> list[Any]:
        """Prompt ids that arrived as text (token_ids.py) as shared blocks of that text, cut at
        the first comma after every TEXT_BLOCK bytes (cuts depend only on the text before them,
        so consecutive calls share their leading blocks), and the last piece inline. A block
        this process saw before (BLOCKS, keyed by a digest of its text) and whose chunk is
        stored for the session is referenced without parsing it; a new block is parsed and
        stored like any other (same digest as the same ids from a list). Decoding is unchanged:
        a record's blocks are concatenated whatever their sizes.

        Whole blocks are looked up TEXT_GROUP at a time first (one digest of their text for the
        group's block digests): per block, the lookup's Python steps cost more than hashing its
        1.5 KB."""
        text = ids.text
        view = memoryview(text)
        spans, tail = ids.spans(TEXT_BLOCK)
        out: list[Any] = []
        grouped = len(spans) - len(spans) % TEXT_GROUP
        for g in range(0, grouped, TEXT_GROUP):
            group = spans[g:g + TEXT_GROUP]
            hasher = hashlib.sha256(b"T")  # "T": a group's key, apart from its blocks' ("t")
            hasher.update(view[group[0][0]:group[-1][1]])
            key = hasher.digest()[:16]
            joined = BLOCKS.get(key)
            if joined is not None:
                refs = [joined[i:i + DIGEST] for i in range(0, len(joined), DIGEST)]
                if all(ref in self.known or ref in self.chunks for ref in refs):
                    self.used.update(refs)
                    out.extend(refs)
                    continue
            refs = [self._text_block(text, start, end) for start, end in group]
            if all(isinstance(ref, bytes) and len(ref) == DIGEST for ref in refs):
                BLOCKS.put(key, b"".join(refs))
            out.extend(refs)
        out.extend(self._text_block(text, start, end) for start, end in spans[grouped:])
        out.extend(parse_ids(text[tail:]))
        return out

    def _text_block(self, text: bytes, start: int, end: int) -> Any:
        piece = text[start:end]
        # "t": text pieces keyed apart from uint32 blocks
        return self._block(digest(b"t" + piece, 16), lambda: parse_ids(piece))

    def request(self, body: Any) -> Any:
        if not isinstance(body, dict):
            return body if body is None else self.ref(body)
        return {k: self.refs(v) if isinstance(v, list) and k != "tools" else self.ref(v, repeated=k == "tools")
                for k, v in body.items()}

    def envelope(self, record: CaptureRecord) -> dict[str, Any]:
        env = record.to_dict(text_ids=True)
        env["messages"] = self.refs(record.messages or [])
        env["tools"] = self.ref(record.tools or [], repeated=True)
        env["response_message"] = self.ref(record.response_message)
        env["request"] = self.request(record.request)
        ids = record.prompt_token_ids
        env["prompt_token_ids"] = self.text_ids(ids) if isinstance(ids, TokenIds) else self.ids(list(ids or []))
        return env


STORED_MAX = 16384  # packed envelopes up to this size are stored in zlib's uncompressed blocks
_STORED_HEAD = b"\x78\x01"  # a zlib header: deflate, 32K window, "fastest" level (FLEVEL 0)


def zlib_stored(data: bytes) -> bytes:
    """`data` as a zlib stream of stored (uncompressed) deflate blocks (RFC 1950/1951): what
    `zlib.decompress` reads back, without deflate's setup. `zlib.compress` allocates and clears
    its ~256 KB state on every call, which costs more than it saves on a 1-3 KB envelope (it
    saves about a fifth of its bytes); the bulk of a record, its chunks, is compressed
    (tests/store/test_record_envelope_zlib.py; bench/bench_envelope.py)."""

    parts: list[bytes | memoryview] = [_STORED_HEAD]
    view = memoryview(data)
    for start in range(0, max(len(data), 1), 65535):
        piece = view[start:start + 65535]
        last = 1 if start + 65535 >= len(data) else 0
        parts.append(struct.pack("<BHH", last, len(piece), len(piece) ^ 0xFFFF))
        parts.append(piece)
    parts.append(struct.pack(">I", zlib.adler32(data)))
    return b"".join(parts)


def encode(record: CaptureRecord, encoder: Encoder | None = None) -> tuple[bytes, Chunks, set[bytes]]:
    """(envelope blob, new chunks to store, every digest it refers to). Pass one encoder to
    collect the chunks of several records. The envelope is a zlib stream: compressed when large,
    in stored blocks when small (`zlib_stored`); decoding reads both alike."""
    enc = encoder or Encoder()
    packed = _pack(enc.envelope(record))
    body = zlib_stored(packed) if len(packed) <= STORED_MAX else zlib.compress(packed, 1)
    return ENVELOPE_MAGIC + body, enc.chunks, enc.used


class MissingChunk(KeyError):
    """An envelope refers to a chunk that is not stored (the session was partly collected)."""


class ChunkReader:
    """Chunks of one session, each decompressed once however many records share it. Values are
    unpacked per use, so records never share (and never alias) mutable objects."""

    def __init__(self, stored: dict[bytes, bytes]):
        self.stored = stored
        self.packed: dict[bytes, bytes] = {}

    def __call__(self, digest: bytes) -> Any:
        packed = self.packed.get(digest)
        if packed is None:
            stored = self.stored.get(digest)
            if stored is None:
                raise MissingChunk(digest.hex())
            packed = self.packed[digest] = decompress(stored)
        return _unpack(packed)


def envelope(blob: bytes) -> dict[str, Any] | None:
    """A stored record's envelope as packed (digests where chunks go); None for a whole-record
    blob written before this layout."""
    if not blob.startswith(ENVELOPE_MAGIC):
        return None
    env: dict[str, Any] = _unpack(zlib.decompress(blob[len(ENVELOPE_MAGIC):]))
    return env


def chunk_value(stored: bytes) -> Any:
    """One stored chunk's value."""
    return _unpack(decompress(stored))


def references(env: dict[str, Any]) -> set[bytes]:
    """Every chunk digest an envelope refers to (what `decode` will look up)."""
    out = {v for v in env.get("messages") or [] if isinstance(v, bytes)}
    for name in ("tools", "response_message"):
        if isinstance(env.get(name), bytes):
            out.add(env[name])
    req = env.get("request")
    if isinstance(req, dict):
        for v in req.values():
            out.update(e for e in (v if isinstance(v, list) else [v]) if isinstance(e, bytes))
    elif isinstance(req, bytes):
        out.add(req)
    out.update(p for p in env.get("prompt_token_ids") or [] if isinstance(p, bytes))
    return out


def decode(blob: bytes, chunks: ChunkReader | dict[bytes, bytes]) -> CaptureRecord:
    """A record from its blob and its session's chunks. Whole-record blobs written before this
    layout decode too."""
    if not blob.startswith(ENVELOPE_MAGIC):
        return CaptureRecord.from_dict(_unpack(blob))
    env = _unpack(zlib.decompress(blob[len(ENVELOPE_MAGIC):]))
    reader = chunks if isinstance(chunks, ChunkReader) else ChunkReader(chunks)

    def get(v: Any) -> Any:
        return reader(v) if isinstance(v, bytes) else v

    env["messages"] = [get(m) for m in env.get("messages") or []]
    env["tools"] = get(env.get("tools"))
    env["response_message"] = get(env.get("response_message"))
    req = env.get("request")
    if isinstance(req, dict):
        env["request"] = {k: [get(e) for e in v] if isinstance(v, list) else get(v) for k, v in req.items()}
    else:
        env["request"] = get(req)
    ids: list[int] = []
    for part in env.get("prompt_token_ids") or []:
        if isinstance(part, bytes):
            ids.extend(get(part))
        else:
            ids.append(part)
    env["prompt_token_ids"] = ids
    return CaptureRecord.from_dict(env)
