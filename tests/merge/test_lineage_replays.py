"""Lineage on the real CLIs' own traffic: each fixture in tests/replays/lineage (written by
scripts/record_lineage.py: the real CLI using its sub-agent tool, or compacting on a small window,
against the scripted stand-in) is replayed into a gateway in front of the stand-in run with the
fixture's script, so every answer and token is the recorded one; the trajectory must then link
the child to its tool call (`spawned_by`) and the conversation after a compaction to the summary
call (`continues_from = {"trace_index", "reason": "compaction"}`), the summary kept trainable
(CONTRACT "Agent lineage and versions per token"; docs/lineage.md)."""

from __future__ import annotations

import json

import pytest

from tests.support import lineage_replay
from tests.support.servers import FULL, GatewayHandle, start_gateway, start_model_server, stop
from polar_mq.merge.agents import COMPACTION_REQUESTS

FIXTURES = lineage_replay.fixtures()
# In the default run: one compaction and one sub-agent replay (with the live Claude Code and
# opencode cases of tests/harnesses/test_lineage_real_cli.py); the rest with POLAR_FULL=1.
DEFAULT = {"codex/compaction", "qwen_code/subagent"}


def _id(path):
    return f"{path.parent.name}/{path.stem}"


def _params(scenario):
    return [pytest.param(p, id=_id(p), marks=() if _id(p) in DEFAULT or FULL else pytest.mark.full)
            for p in FIXTURES if p.stem == scenario]


@pytest.fixture()
def replayed(request, log_dir, redis_url, tmp_path):
    """(fixture, calls by id, trajectory per builder) of one fixture replayed."""
    path = request.param
    fixture = lineage_replay.load(path)
    script = lineage_replay.write_script(fixture, tmp_path / "script.json")
    ms = start_model_server(log_dir, "--scripted", str(script), "--max-model-len",
                            str(fixture["stand_in"]["max_model_len"]), name=f"ms-{path.parent.name}")
    gw = start_gateway(log_dir, redis_url, [ms.url], name=f"gw-{path.parent.name}")
    try:
        handle = GatewayHandle(url=gw.url, upstream_url=ms.url, redis_url=redis_url, server=gw)
        sid = lineage_replay.replay(gw.url, fixture, handle.admin_headers, _id(path))
        calls = {c["call_id"]: c for c in handle.calls(sid)}
        trajs = {b: lineage_replay.trajectory(gw.url, sid, handle.admin_headers, b)
                 for b in ("prefix_merging", "per_request")}
        yield fixture, calls, trajs
    finally:
        stop(gw.proc)
        stop(ms.proc)


def test_fixtures_cover_every_harness():
    names = {_id(p) for p in FIXTURES}
    assert DEFAULT <= names, names
    assert {p.parent.name for p in FIXTURES if p.stem == "compaction"} >= {"claude_code", "opencode"}
    for p in FIXTURES:
        fx = lineage_replay.load(p)
        assert fx["requests"] and all(r["generation"] is not None for r in fx["requests"]), p


def _last_user_text(call):
    users = [m for m in call["messages"] if m.get("role") == "user"]
    return json.dumps(users[-1].get("content")) if users else ""


@pytest.mark.timeout(600)
@pytest.mark.parametrize("replayed", _params("compaction"), indirect=True)
def test_a_real_cli_compaction_continues_from_its_summary(replayed):
    fixture, calls, trajs = replayed
    for builder, traj in trajs.items():
        traces = traj["traces"]
        summaries = [i for i, t in enumerate(traces) if t["metadata"].get("compaction_summary")]
        assert summaries, (builder, [_last_user_text(c)[:120] for c in calls.values()])
        for i in summaries:
            meta = traces[i]["metadata"]["compaction_summary"]
            call = calls[meta["call_id"]]
            assert any(p in _last_user_text(call) for p in COMPACTION_REQUESTS), _last_user_text(call)[-300:]
            # the summary's tokens are sampled and trainable in its trace
            assert call["call_id"] in traces[i]["call_ids"]
            assert sum(traces[i]["loss_mask"]) >= len(call["completion_token_ids"]) > 0
        after = [t for t in traces if t["metadata"].get("continues_from")]
        assert after, (builder, traj["stats"]["origins"])
        for t in after:
            link = t["metadata"]["continues_from"]
            assert link["reason"] == "compaction" and set(link) == {"trace_index", "reason"}
            assert link["trace_index"] in summaries
            first = calls[t["call_ids"][0]]
            summary_call = calls[traces[link["trace_index"]]["metadata"]["compaction_summary"]["call_id"]]
            assert summary_call["started_at"] <= first["started_at"] and first["call_id"] != summary_call["call_id"]
        assert traj["stats"]["compactions"] >= 1 and traj["stats"]["origins"]["compaction"] >= 1, traj["stats"]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("replayed", _params("subagent"), indirect=True)
def test_a_real_cli_subagent_replay_is_linked(replayed):
    fixture, calls, trajs = replayed
    tool = fixture["stand_in"]["script"][0]["tool"].rpartition(".")[2]  # Codex: NAMESPACE.NAME
    for builder, traj in trajs.items():
        linked = [t for t in traj["traces"] if t["metadata"].get("spawned_by")]
        assert linked, (builder, traj["stats"]["origins"])
        for t in linked:
            link = t["metadata"]["spawned_by"]
            assert link["tool"] == tool and link["call_id"] in traj["traces"][link["trace_index"]]["call_ids"]
            assert link["call_id"] not in t["call_ids"]
        assert traj["stats"]["subagents"] >= 1 and traj["stats"]["origins"]["sub_agent"] >= 1
