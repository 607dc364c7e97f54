"""Export round trips: token-level JSONL / Parquet and SFT JSONL, loaded back with HF datasets."""

from __future__ import annotations

import json
import os

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest

from polar_mq.rl.export import export
from polar_mq.rl.export import select
from polar_mq.rl.export import sft_rows
from polar_mq.rl.export import token_rows
from polar_mq.model import Trace, Trajectory

TOOLS = [{"type": "function", "function": {"name": "bash", "description": "run a command",
                                           "parameters": {"type": "object",
                                                          "properties": {"cmd": {"type": "string"}},
                                                          "required": ["cmd"]}}}]


def make_trajectories() -> list[Trajectory]:
    main = Trace(
        prompt_ids=[1, 2, 3], response_ids=[10, 11, 12, 13], loss_mask=[1, 1, 0, 1],
        response_logprobs=[-0.5, -0.25, 0.0, -1.0],
        messages=[{"role": "system", "content": "be brief"},
                  {"role": "user", "content": [{"type": "text", "text": "list "}, {"type": "text", "text": "files"}]},
                  {"role": "assistant", "content": None,
                   "tool_calls": [{"id": "c1", "type": "function",
                                   "function": {"name": "bash", "arguments": "{\"cmd\": \"ls\"}"}}]},
                  {"role": "tool", "tool_call_id": "c1", "content": "a.txt"},
                  {"role": "assistant", "content": "a.txt"}],
        tools=TOOLS, finish_reason="stop", call_ids=["call_a", "call_b"], metadata={"role": "main", "calls": 2})
    side = Trace(prompt_ids=[7], response_ids=[8], loss_mask=[1], response_logprobs=None,
                 messages=[{"role": "user", "content": "title?"}], finish_reason="stop",
                 metadata={"role": "side", "response_message": {"role": "assistant", "content": "Files"}})
    return [
        Trajectory(session_id="s-good", task_id="t1", status="COMPLETED", builder="prefix_merging",
                   traces=[main, side], reward=1.0, metadata={"harness": "codex"}),
        Trajectory(session_id="s-low", task_id="t1", status="COMPLETED", traces=[
            Trace(prompt_ids=[1], response_ids=[2, 3], loss_mask=[1, 1], response_logprobs=[-0.1, -0.2],
                  messages=[{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
                  reward=0.1)], reward=0.1, metadata={"agent": {"harness": "shell"}}),
        Trajectory(session_id="s-timeout", task_id="t1", status="TIMEOUT", traces=[], reward=None,
                   metadata={"harness": "codex"}),
    ]


def test_select_filters():
    trajs = make_trajectories()
    dicts = [t.to_dict() for t in trajs]
    assert [t.session_id for t in select(dicts, status="completed")] == ["s-good", "s-low"]
    assert [t.session_id for t in select(trajs, status=["TIMEOUT"])] == ["s-timeout"]
    assert [t.session_id for t in select(trajs, min_reward=0.5)] == ["s-good"]
    assert [t.session_id for t in select(trajs, harness="shell")] == ["s-low"]
    assert [t.session_id for t in select(trajs, harness="codex", status="COMPLETED")] == ["s-good"]


def test_token_rows_shape():
    rows = list(token_rows(make_trajectories()))
    assert len(rows) == 3
    first = rows[0]
    assert first["session_id"] == "s-good" and first["task_id"] == "t1" and first["role"] == "main"
    assert first["prompt_ids"] == [1, 2, 3] and first["response_ids"] == [10, 11, 12, 13]
    assert first["loss_mask"] == [1, 1, 0, 1] and first["logprobs"] == [-0.5, -0.25, 0.0, -1.0]
    assert first["reward"] == 1.0 and first["harness"] == "codex"
    meta = json.loads(first["metadata"])
    assert meta["trace"]["calls"] == 2 and meta["call_ids"] == ["call_a", "call_b"]
    assert meta["builder"] == "prefix_merging"
    assert rows[1]["role"] == "side" and rows[1]["logprobs"] is None and rows[1]["reward"] == 1.0
    assert rows[2]["reward"] == 0.1 and rows[2]["harness"] == "shell"
    assert [r["role"] for r in token_rows(make_trajectories(), roles=["side"])] == ["side"]


def load(kind: str, path, tmp_path):
    datasets = pytest.importorskip("datasets")
    return datasets.load_dataset(kind, data_files=str(path), split="train", cache_dir=str(tmp_path / "hf"))


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_token_export_loads_with_datasets(fmt, tmp_path):
    if fmt == "parquet":
        pytest.importorskip("pyarrow")
    out = tmp_path / f"rows.{fmt}"
    n = export(make_trajectories(), out, fmt)
    assert n == 3
    ds = load("json" if fmt == "jsonl" else "parquet", out, tmp_path)
    assert ds.num_rows == 3
    assert {"prompt_ids", "response_ids", "loss_mask", "logprobs", "reward", "session_id", "task_id", "role",
            "metadata"} <= set(ds.column_names)
    assert ds[0]["prompt_ids"] == [1, 2, 3] and ds[0]["loss_mask"] == [1, 1, 0, 1]
    assert ds[0]["logprobs"] == pytest.approx([-0.5, -0.25, 0.0, -1.0])
    assert ds[1]["logprobs"] is None
    assert ds[2]["reward"] == pytest.approx(0.1)
    assert json.loads(ds[0]["metadata"])["trace"]["role"] == "main"
    for row in ds:
        assert len(row["loss_mask"]) == len(row["response_ids"])

    filtered = tmp_path / f"filtered.{fmt}"
    assert export(make_trajectories(), filtered, fmt, min_reward=0.5, roles=["main"]) == 1
    ds = load("json" if fmt == "jsonl" else "parquet", filtered, tmp_path)
    assert ds.num_rows == 1 and ds[0]["session_id"] == "s-good"


def test_empty_parquet_is_valid(tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    out = tmp_path / "empty.parquet"
    assert export(make_trajectories(), out, "parquet", status="ERROR") == 0
    table = pq.read_table(out)
    assert table.num_rows == 0 and "prompt_ids" in table.column_names


def test_sft_export_openai_chat_with_tools(tmp_path):
    rows = list(sft_rows(make_trajectories()))
    assert [r["session_id"] for r in rows] == ["s-good", "s-good", "s-low"]
    main = rows[0]
    assert main["tools"] == TOOLS
    assert main["messages"][1] == {"role": "user", "content": "list files"}  # text parts joined
    assert main["messages"][2]["tool_calls"][0]["function"]["name"] == "bash"
    assert main["messages"][-1] == {"role": "assistant", "content": "a.txt"}
    side = rows[1]
    assert side["role"] == "side" and side["messages"][-1] == {"role": "assistant", "content": "Files"}

    out = tmp_path / "sft.jsonl"
    assert export(make_trajectories(), out, "sft", harness="codex", roles=["main"]) == 1
    ds = load("json", out, tmp_path)
    assert ds.num_rows == 1
    msgs = ds[0]["messages"]
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "tool", "assistant"]
    assert msgs[2]["tool_calls"][0]["function"]["arguments"] == "{\"cmd\": \"ls\"}"
    assert ds[0]["tools"][0]["function"]["name"] == "bash"


def test_bad_format_and_stdout(capsys):
    with pytest.raises(ValueError):
        export(make_trajectories(), "x", "csv")
    with pytest.raises(ValueError):
        export(make_trajectories(), "-", "parquet")
    assert export(make_trajectories(), "-", "jsonl", status="COMPLETED") == 3
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3 and json.loads(lines[0])["session_id"] == "s-good"
