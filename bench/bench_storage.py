"""Redis bytes of one long Claude-Code-sized session: its gateway records and its stored result.

The session is grown from the real Claude Code request in tests/replays/claude_code/anthropic.json
(its 24 tools, system blocks with the per-turn billing line, metadata, thinking config): every
turn appends the assistant's tool call and a ~2 KB tool result (text of real source files) and
moves `cache_control` to the last message, as Claude Code does. Each request goes through the
gateway's Anthropic adapter (`to_chat`) and the stand-in model's tokenizer and chat template, so
`messages`, `tools` and `prompt_token_ids` are what the gateway would record; the sampled ids are
the tokens of the tool call, with logprobs.

Baseline: each record as one msgpack blob in a Redis list. GatewayStore: store/codec.py, each
chunk once per session, zlib. Both are measured in the same run with
`MEMORY USAGE key SAMPLES 0` in a private redis-server, and the records read back are compared
with what was written.

A finished session also keeps its result trajectory (`PipelineStore.save_trajectory`, key
`traj:<session>:result`) next to its gateway records until both are collected. Before: the
trajectory dict as one msgpack value; after: store/trajectory_codec.py (each trace's prompt ids a
delta of an earlier trace, repeated messages and tools once, ids and logprobs as arrays, zlib),
for both builders; read back through get_trajectory and trajectory_blobs and compared.

Information of the session (the yardstick of the ≤ 3x goal): the JSON bytes of each distinct
normalised message once, the tools once, 4 bytes per token id of the longest chain (the last
call's prompt + sampled ids) and 8 bytes per sampled token of every call (id + float32 logprob).

    .venv/bin/python bench/bench_storage.py [--turns 50] [--result-bytes 2000] [--id-offset 0]

`--id-offset N` adds N to every token id: the stand-in tokenizer's ids are < 4096 (3 msgpack
bytes), a real model's run to ~150,000 (5 bytes); the information counts 4 bytes per id either way.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import msgpack
import redis

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from polar_mq.model import CaptureRecord  # noqa: E402
from polar_mq.dev.model_server.tokenizer import load_tokenizer  # noqa: E402
from polar_mq.proxy_app.adapters import anthropic  # noqa: E402
from polar_mq.proxy_app.capture import new_record  # noqa: E402
from polar_mq.merge.registry import build  # noqa: E402
from polar_mq.store.core import GatewayStore, pack  # noqa: E402
from polar_mq.store.pipeline import PipelineStore  # noqa: E402

REPLAY = ROOT / "tests" / "replays" / "claude_code" / "anthropic.json"
GIB = 1024 ** 3


def tool_result_texts(size: int) -> list[str]:
    """~size-byte pieces of real source text (what `cat`/`grep` tool results look like)."""
    text = "".join(p.read_text() for p in sorted((ROOT / "polar_mq").rglob("*.py")))
    return [text[i:i + size] for i in range(0, len(text) - size, size)]


def claude_code_session(turns: int, result_bytes: int = 2000, session_id: str = "bench",
                        id_offset: int = 0) -> list[CaptureRecord]:
    """The records a `turns`-call Claude Code session leaves (see the module docstring)."""
    replay = json.loads(REPLAY.read_text())
    first = next(r for r in replay["requests"] if r.get("generation"))["body"]
    tok = load_tokenizer()
    results = tool_result_texts(result_bytes)
    rng = random.Random(7)
    messages: list[dict[str, Any]] = [copy.deepcopy(first["messages"][0])]
    records = []
    for turn in range(turns):
        body = copy.deepcopy(first)
        body["system"][0]["text"] = f"x-anthropic-billing-header: cc_version=2.1.197.{turn:03x}; cc_entrypoint=sdk-cli;"
        body["messages"] = copy.deepcopy(messages)
        last = body["messages"][-1]
        if isinstance(last["content"], list):
            last["content"][-1]["cache_control"] = {"type": "ephemeral"}
        req = anthropic.to_chat(body)
        rec = new_record(session_id, "anthropic", req, body, "stand-in")
        rec.started_at = 1_700_000_000 + turn
        rec.prompt_token_ids = [i + id_offset for i in tok.encode(tok.render(req.messages, tools=req.tools or None,
                                                                             add_generation_prompt=True))]
        call_id = f"toolu_{hashlib.sha1(str(turn).encode()).hexdigest()[:20]}"
        command = f"sed -n {turn * 40 + 1},{turn * 40 + 40}p polar_mq/module_{turn}.py"
        call_text = json.dumps({"name": "Bash", "arguments": {"command": command}})
        rec.completion_token_ids = [i + id_offset for i in tok.encode(f"<tool_call>\n{call_text}\n</tool_call><|im_end|>")]
        rec.completion_logprobs = [round(-rng.random() * 2, 6) for _ in rec.completion_token_ids]
        rec.response_message = {"role": "assistant", "content": None, "tool_calls": [
            {"id": call_id, "type": "function",
             "function": {"name": "Bash", "arguments": json.dumps({"command": command})}}]}
        rec.finish_reason = "tool_calls"
        rec.usage = {"prompt_tokens": len(rec.prompt_token_ids),
                     "completion_tokens": len(rec.completion_token_ids)}
        records.append(rec)
        messages.append({"role": "assistant", "content": [
            {"type": "tool_use", "id": call_id, "name": "Bash", "input": {"command": command}}]})
        messages.append({"role": "user", "content": [
            {"tool_use_id": call_id, "type": "tool_result", "content": results[turn % len(results)]}]})
    return records


def information_bytes(records: list[CaptureRecord]) -> int:
    """Each distinct message once + tools once + the longest chain's ids + every sampled token."""
    distinct = set()
    for rec in records:
        for m in list(rec.messages) + ([rec.response_message] if rec.response_message else []):
            distinct.add(json.dumps(m, sort_keys=True))
    tools = {json.dumps(rec.tools, sort_keys=True) for rec in records}
    last = records[-1]
    chain = len(last.prompt_token_ids) + len(last.completion_token_ids)
    sampled = sum(len(r.completion_token_ids) for r in records)
    return sum(len(s.encode()) for s in distinct | tools) + 4 * chain + 8 * sampled


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def key_bytes(r: redis.Redis, pattern: str) -> int:
    return sum(int(r.memory_usage(k, samples=0) or 0) for k in r.scan_iter(match=pattern, count=1000))


BUILDERS = ("prefix_merging", "per_request")


def results(r: redis.Redis, records: list[CaptureRecord]) -> dict[str, dict[str, Any]]:
    """Each builder's result trajectory stored the old way (one msgpack value) and through
    PipelineStore (trajectory_codec), read back through every reader and compared."""
    pipeline = PipelineStore(r)
    out: dict[str, dict[str, Any]] = {}
    for builder in BUILDERS:
        traj = build(builder, records, session_id=f"bench-{builder}")
        whole = traj.to_dict()
        r.set(f"old:traj:{builder}", pack(whole))
        t0 = time.perf_counter()
        pipeline.save_trajectory(traj)
        save_ms = (time.perf_counter() - t0) * 1000
        t0 = time.perf_counter()
        back = pipeline.get_trajectory(traj.session_id)
        read_ms = (time.perf_counter() - t0) * 1000
        assert back is not None and back.to_dict() == whole, f"{builder}: trajectory round trip differs"
        assert pipeline.trajectory_blobs([traj.session_id]) == [pack(whole)], f"{builder}: blob differs"
        out[builder] = {"traces": len(traj.traces),
                        "before_bytes": int(r.memory_usage(f"old:traj:{builder}", samples=0) or 0),
                        "after_bytes": int(r.memory_usage(pipeline.keys.trajectory(traj.session_id, "result"),
                                                          samples=0) or 0),
                        "save_ms": round(save_ms, 1), "read_ms": round(read_ms, 1)}
    return out


def measure(turns: int, result_bytes: int, id_offset: int = 0) -> dict[str, Any]:
    records = claude_code_session(turns, result_bytes, id_offset=id_offset)
    exe = shutil.which("redis-server")
    if not exe:
        raise SystemExit("redis-server is not on PATH")
    port = free_port()
    tmp = tempfile.mkdtemp(prefix="pmq-bench-storage-")
    proc = subprocess.Popen([exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly",
                             "no", "--dir", tmp], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        r = redis.Redis(port=port)
        for _ in range(100):
            try:
                r.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.05)
        # Before: the old layout, one whole msgpack record per list element.
        for rec in records:
            r.rpush("old:gw:calls:bench", msgpack.packb(rec.to_dict(), use_bin_type=True))
        before = key_bytes(r, "old:*")
        t0 = time.perf_counter()
        old = [CaptureRecord.from_dict(msgpack.unpackb(b, raw=False)) for b in r.lrange("old:gw:calls:bench", 0, -1)]
        old_read_ms = (time.perf_counter() - t0) * 1000
        assert len(old) == len(records)
        # After: the gateway store.
        store = GatewayStore(r)
        t0 = time.perf_counter()
        for rec in records:
            store.append_call(rec)
        write_ms = (time.perf_counter() - t0) * 1000 / len(records)
        t0 = time.perf_counter()
        back = store.calls("bench")
        read_ms = (time.perf_counter() - t0) * 1000
        assert [b.to_dict() for b in back] == [rec.to_dict() for rec in records], "round trip differs"
        after = key_bytes(r, "pmq:gw:*:bench")
        trajectories = results(r, records)
    finally:
        proc.terminate()
        proc.wait(10)
        shutil.rmtree(tmp, ignore_errors=True)
    info = information_bytes(records)
    last = records[-1]
    return {"turns": turns, "first_request_bytes": len(json.dumps(records[0].request)),
            "last_request_bytes": len(json.dumps(last.request)),
            "last_prompt_tokens": len(last.prompt_token_ids), "information_bytes": info,
            "before_bytes": before, "after_bytes": after, "write_ms_per_call": round(write_ms, 2),
            "read_ms_session": round(read_ms, 1), "old_read_ms_session": round(old_read_ms, 1),
            "results": trajectories}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--turns", type=int, default=50)
    ap.add_argument("--result-bytes", type=int, default=2000)
    ap.add_argument("--id-offset", type=int, default=0)
    args = ap.parse_args()
    m = measure(args.turns, args.result_bytes, args.id_offset)
    print(f"{m['turns']}-call Claude Code session: requests {m['first_request_bytes'] / 1000:.0f} KB -> "
          f"{m['last_request_bytes'] / 1000:.0f} KB, last prompt {m['last_prompt_tokens']} tokens")
    print(f"{'':24}{'bytes':>12}{'x information':>15}{'sessions in 16 GiB':>20}")
    print(f"{'information':24}{m['information_bytes']:>12}{1.0:>15.2f}{'':>20}")
    for label, key in (("before (whole records)", "before_bytes"), ("after (chunked, zlib)", "after_bytes")):
        b = m[key]
        print(f"{label:24}{b:>12}{b / m['information_bytes']:>15.2f}{int(16 * GIB // b):>20}")
    print(f"after / before = {m['after_bytes'] / m['before_bytes']:.4f} "
          f"({m['before_bytes'] / m['after_bytes']:.1f}x smaller); "
          f"write {m['write_ms_per_call']} ms/call; read all calls {m['old_read_ms_session']} ms before, "
          f"{m['read_ms_session']} ms after")
    info, gw = m["information_bytes"], m["after_bytes"]
    print(f"finished session = gateway records (chunked, {gw} B) + result trajectory; before: result as one "
          "msgpack value, after: trajectory_codec")
    print(f"{'builder':16}{'traces':>7}{'result before':>15}{'result after':>14}"
          f"{'session before':>16}{'x info':>8}{'session after':>15}{'x info':>8}")
    for builder, t in m["results"].items():
        sb, sa = gw + t["before_bytes"], gw + t["after_bytes"]
        print(f"{builder:16}{t['traces']:>7}{t['before_bytes']:>15}{t['after_bytes']:>14}"
              f"{sb:>16}{sb / info:>8.2f}{sa:>15}{sa / info:>8.2f}")
    print("result save / read ms: " + ", ".join(f"{b} {t['save_ms']} / {t['read_ms']}" for b, t in m["results"].items()))


if __name__ == "__main__":
    main()
