"""Trajectory → rows → files (JSONL, Parquet, SFT JSONL)."""

from __future__ import annotations

import json
import os
import sys
from typing import Any, Iterable, Iterator, Mapping

from polar_mq.model import Trace, Trajectory

FORMATS = ("jsonl", "parquet", "sft")


def as_trajectory(obj: Trajectory | Mapping[str, Any]) -> Trajectory:
    return obj if isinstance(obj, Trajectory) else Trajectory.from_dict(dict(obj))


def harness_of(traj: Trajectory) -> str | None:
    meta = traj.metadata or {}
    harness = meta.get("harness")
    if harness is None and isinstance(meta.get("agent"), dict):
        harness = meta["agent"].get("harness")
    return harness


def trace_role(trace: Trace) -> str:
    return (trace.metadata or {}).get("role") or "main"


def _statuses(status: str | Iterable[str] | None) -> set[str] | None:
    if status is None:
        return None
    items = status.split(",") if isinstance(status, str) else list(status)
    return {s.strip().upper() for s in items if s and s.strip()} or None


def select(trajectories: Iterable[Trajectory | Mapping[str, Any]], *, status: str | Iterable[str] | None = None,
           min_reward: float | None = None, harness: str | Iterable[str] | None = None) -> list[Trajectory]:
    """Trajectories that pass every given filter (a missing reward fails `min_reward`)."""
    wanted_status = _statuses(status)
    harnesses = None if harness is None else ({harness} if isinstance(harness, str) else set(harness))
    out = []
    for obj in trajectories:
        traj = as_trajectory(obj)
        if wanted_status is not None and (traj.status or "").upper() not in wanted_status:
            continue
        if min_reward is not None and (traj.reward is None or traj.reward < min_reward):
            continue
        if harnesses is not None and harness_of(traj) not in harnesses:
            continue
        out.append(traj)
    return out


def _traces(trajectories: Iterable[Trajectory], roles: Iterable[str] | None) -> Iterator[tuple[Trajectory, int, Trace]]:
    wanted = set(roles) if roles is not None else None
    for traj in trajectories:
        for i, trace in enumerate(traj.traces):
            if wanted is None or trace_role(trace) in wanted:
                yield traj, i, trace


def token_rows(trajectories: Iterable[Trajectory | Mapping[str, Any]], *,
               roles: Iterable[str] | None = None) -> Iterator[dict[str, Any]]:
    """One row per trace, with a fixed set of columns (same order in every row)."""
    for traj, i, trace in _traces((as_trajectory(t) for t in trajectories), roles):
        reward = trace.reward if trace.reward is not None else traj.reward
        meta = {"trace": trace.metadata or {}, "trajectory": traj.metadata or {}, "builder": traj.builder,
                "call_ids": list(trace.call_ids or [])}
        yield {
            "session_id": traj.session_id,
            "task_id": traj.task_id,
            "trace_index": i,
            "role": trace_role(trace),
            "status": traj.status,
            "harness": harness_of(traj),
            "prompt_ids": [int(t) for t in trace.prompt_ids],
            "response_ids": [int(t) for t in trace.response_ids],
            "loss_mask": [int(m) for m in trace.loss_mask],
            "logprobs": None if trace.response_logprobs is None else [float(x) for x in trace.response_logprobs],
            "reward": None if reward is None else float(reward),
            "finish_reason": trace.finish_reason,
            "metadata": json.dumps(meta, default=str),
        }


def _text_content(content: Any) -> Any:
    """Text-only content parts → one string (the common OpenAI-chat shape trainers expect)."""
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") in ("text", "input_text",
                                                                                  "output_text")
                                         for p in content):
        return "".join(p.get("text") or "" for p in content)
    return content


def _sft_message(msg: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(msg)
    if "content" in out:
        out["content"] = _text_content(out["content"])
    return out


def sft_messages(trace: Trace) -> list[dict[str, Any]]:
    """The conversation of a trace ending with the final assistant response."""
    messages = [_sft_message(m) for m in trace.messages or []]
    final = (trace.metadata or {}).get("response_message")
    if final and (not messages or messages[-1].get("role") != "assistant"):
        messages.append(_sft_message(final))
    return messages


def sft_rows(trajectories: Iterable[Trajectory | Mapping[str, Any]], *,
             roles: Iterable[str] | None = None) -> Iterator[dict[str, Any]]:
    """OpenAI-chat SFT records: `messages` (ending with the assistant's reply) and `tools`."""
    for traj, i, trace in _traces((as_trajectory(t) for t in trajectories), roles):
        messages = sft_messages(trace)
        if not messages or messages[-1].get("role") != "assistant":
            continue  # nothing to learn from
        reward = trace.reward if trace.reward is not None else traj.reward
        yield {
            "messages": messages,
            "tools": list(trace.tools or []),
            "session_id": traj.session_id,
            "task_id": traj.task_id,
            "trace_index": i,
            "role": trace_role(trace),
            "reward": None if reward is None else float(reward),
        }


def write_jsonl(rows: Iterable[Mapping[str, Any]], path: str | os.PathLike[str] | None) -> int:
    """Write rows as JSON lines to `path` ('-' or None: stdout). Returns the row count."""
    n = 0
    if path is None or str(path) == "-":
        for row in rows:
            sys.stdout.write(json.dumps(row, ensure_ascii=False) + "\n")
            n += 1
        sys.stdout.flush()
        return n
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")
            n += 1
    os.replace(tmp, path)
    return n


def parquet_schema() -> Any:
    import pyarrow as pa

    return pa.schema([
        ("session_id", pa.string()),
        ("task_id", pa.string()),
        ("trace_index", pa.int32()),
        ("role", pa.string()),
        ("status", pa.string()),
        ("harness", pa.string()),
        ("prompt_ids", pa.list_(pa.int32())),
        ("response_ids", pa.list_(pa.int32())),
        ("loss_mask", pa.list_(pa.int8())),
        ("logprobs", pa.list_(pa.float32())),
        ("reward", pa.float64()),
        ("finish_reason", pa.string()),
        ("metadata", pa.string()),
    ])


def write_parquet(rows: Iterable[Mapping[str, Any]], path: str | os.PathLike[str],
                  batch_rows: int = 1024) -> int:
    """Token rows → one Parquet file (needs pyarrow). Returns the row count."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError as exc:  # pragma: no cover
        raise RuntimeError("parquet export needs pyarrow: pip install pyarrow") from exc
    schema = parquet_schema()
    n = 0
    tmp = f"{path}.tmp"
    with pq.ParquetWriter(tmp, schema) as writer:
        batch: list[Mapping[str, Any]] = []
        for row in rows:
            batch.append(row)
            if len(batch) >= batch_rows:
                writer.write_table(pa.Table.from_pylist(batch, schema=schema))
                n += len(batch)
                batch = []
        if batch or n == 0:
            writer.write_table(pa.Table.from_pylist(batch, schema=schema))
            n += len(batch)
    os.replace(tmp, path)
    return n


def export(trajectories: Iterable[Trajectory | Mapping[str, Any]], path: str | os.PathLike[str] | None,
           fmt: str = "jsonl", *, status: str | Iterable[str] | None = None, min_reward: float | None = None,
           harness: str | Iterable[str] | None = None, roles: Iterable[str] | None = None) -> int:
    """Filter and write; returns the number of rows written."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; use one of {', '.join(FORMATS)}")
    chosen = select(trajectories, status=status, min_reward=min_reward, harness=harness)
    if fmt == "sft":
        return write_jsonl(sft_rows(chosen, roles=roles), path)
    if fmt == "parquet":
        if path is None or str(path) == "-":
            raise ValueError("parquet needs an output file")
        return write_parquet(token_rows(chosen, roles=roles), path)
    return write_jsonl(token_rows(chosen, roles=roles), path)
