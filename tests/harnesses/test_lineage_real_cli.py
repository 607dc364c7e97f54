"""Sub-agent lineage from the real CLIs' traffic: the stand-in is scripted to call the harness's
sub-agent tool (Claude Code `Agent`, opencode `task`) with a prompt; the CLI starts the child
conversation against the same gateway; the trajectory links the child's traces to the parent's
tool call (CONTRACT "Agent lineage and versions per token")."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
import requests

from tests.support.servers import GatewayHandle, start_gateway, start_model_server, stop
from polar_mq.harnesses import claude_code, install, opencode

pytestmark = [pytest.mark.cli,
              pytest.mark.skipif(not install.npm_available(), reason="node/npm not on PATH")]

PROMPT = "Report the number of lines in polar.txt and nothing else, please."
CASES = {
    # harness: (module, sub-agent tool, its arguments)
    "claude_code": (claude_code, "Agent", {"description": "Count lines", "prompt": PROMPT,
                                           "subagent_type": "general-purpose"}),
    "opencode": (opencode, "task", {"description": "Count lines", "prompt": PROMPT,
                                    "subagent_type": "general"}),
}


def cli_bin(name: str) -> str:
    try:
        return str(install.install([name], timeout=900)[name])
    except install.InstallError as exc:
        pytest.skip(f"could not install {name} from npm: {exc}")


@pytest.mark.timeout(1200)
@pytest.mark.parametrize("harness", sorted(CASES))
def test_a_real_cli_subagent_is_linked_to_its_tool_call(harness, log_dir, redis_url, tmp_path):
    module, tool, args = CASES[harness]
    binary = cli_bin(harness)
    # Step k answers the k-th assistant turn after the last real user message: the parent's
    # first turn calls the sub-agent tool; the child (whose first user message is the prompt)
    # gets the same step 0 (a tool it may not have: the CLI answers with an error result) and
    # then step 1's text, which returns to the parent as the tool result; the parent finishes.
    script = tmp_path / "steps.json"
    script.write_text(json.dumps([{"tool": tool, "arguments": args}, {"text": "1 line."}]))
    ms = start_model_server(log_dir, "--scripted", str(script), "--max-model-len", "65536",
                            name=f"ms-sub-{harness}")
    gw = start_gateway(log_dir, redis_url, [ms.url], name=f"gw-sub-{harness}")
    try:
        handle = GatewayHandle(url=gw.url, upstream_url=ms.url, redis_url=redis_url, server=gw)
        sess = handle.new_session()
        home, work = tmp_path / "home", tmp_path / "work"
        work.mkdir()
        (work / "polar.txt").write_text("polar\n")
        launch = module.configure(home, sess["base_urls"], sess["key"], "stand-in",
                                  "Delegate: count the lines of polar.txt", bin=binary)
        proc = subprocess.run(launch.argv, env={**os.environ, **launch.env}, cwd=work,
                              stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=180)
        calls = handle.calls(sess["session_id"])
        spawners = [c for c in calls if any(
            tc["function"]["name"] == tool and json.loads(tc["function"]["arguments"]).get("prompt") == PROMPT
            for tc in (c.get("response_message") or {}).get("tool_calls") or [])]
        assert spawners, (proc.returncode, proc.stderr[-2000:], [c.get("messages", [])[-1:] for c in calls])
        for builder in ("prefix_merging", "per_request"):
            traj = requests.get(f"{gw.url}/sessions/{sess['session_id']}/trajectory",
                                headers=handle.admin_headers, params={"builder": builder}, timeout=60).json()
            linked = [t for t in traj["traces"] if t["metadata"].get("spawned_by")]
            assert linked, (builder, [t["metadata"].get("role") for t in traj["traces"]],
                            [(c["messages"][:3]) for c in calls])
            parent_ids = {c["call_id"] for c in spawners}
            for t in linked:
                link = t["metadata"]["spawned_by"]
                assert link["tool"] == tool and link["call_id"] in parent_ids
                parent = traj["traces"][link["trace_index"]]
                assert link["call_id"] in parent["call_ids"]
                assert link["call_id"] not in t["call_ids"]  # (a child may spawn its own: nested)
                assert any(s["tool_call_id"] == link["tool_call_id"] for s in parent["metadata"]["spawned"])
            assert traj["stats"]["subagents"] >= 1 and traj["stats"]["origins"]["sub_agent"] >= 1
            print(harness, builder, proc.returncode, traj["stats"]["origins"], traj["stats"]["subagents"],
                  [(t["call_ids"], t["metadata"].get("spawned_by"), t["metadata"]["origin"]) for t in traj["traces"]])
    finally:
        stop(gw.proc)
        stop(ms.proc)


@pytest.mark.timeout(1200)
def test_real_claude_code_compaction_is_linked(gateway, tmp_path):
    """`claude -p /compact --continue` between two turns of one conversation: the summary call is
    a trainable trace and the conversation after it continues from it."""
    binary = cli_bin("claude_code")
    sess = gateway.new_session()
    home, work = tmp_path / "home", tmp_path / "work"
    work.mkdir()
    outs = []
    turns = [("Say hello polar:notool", [])] + [(f"Say hello {n} polar:notool", ["--continue"])
                                                 for n in range(3)]
    turns += [("/compact", ["--continue"]), ("Say goodbye polar:notool", ["--continue"])]
    for k, (prompt, extra) in enumerate(turns):
        launch = claude_code.configure(home, sess["base_urls"], sess["key"], "stand-in", prompt, bin=binary)
        proc = subprocess.run(launch.argv + extra, env={**os.environ, **launch.env}, cwd=work,
                              stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=180)
        outs.append((k, proc.returncode, proc.stdout[-500:], proc.stderr[-1000:]))
    calls = gateway.calls(sess["session_id"])
    for builder in ("prefix_merging", "per_request"):
        traj = requests.get(f"{gateway.url}/sessions/{sess['session_id']}/trajectory",
                            headers=gateway.admin_headers, params={"builder": builder}, timeout=60).json()
        # Claude Code's summary request extends the main conversation token by token (history
        # plus the compact prompt): the summary is sampled inside the main trace, trainable there.
        summaries = [i for i, t in enumerate(traj["traces"]) if t["metadata"].get("compaction_summary")]
        assert summaries, (outs, [[str(m.get("content"))[-300:] for m in c["messages"][-1:]] for c in calls])
        summary = traj["traces"][summaries[-1]]
        by_id = {c["call_id"]: c for c in calls}
        summary_call = by_id[summary["metadata"]["compaction_summary"]["call_id"]]
        assert "Your task is to create a detailed summary" in summary_call["messages"][-1]["content"]
        assert summary_call["call_id"] in summary["call_ids"] and sum(summary["loss_mask"]) >= len(
            summary_call["completion_token_ids"])  # kept, trainable
        after = [t for t in traj["traces"] if t["metadata"].get("continues_from")]
        assert after, (outs, [[str(m.get("content"))[:200] for m in c["messages"][:2]] for c in calls])
        for t in after:
            assert t["metadata"]["continues_from"] == {"trace_index": summaries[-1], "reason": "compaction"}
            assert "This session is being continued" in str(by_id[t["call_ids"][0]]["messages"][1]["content"])
        assert traj["stats"]["compactions"] >= 1 and traj["stats"]["origins"]["compaction"] >= 1
        if builder == "prefix_merging":
            assert after[0]["metadata"]["role"] == "main"  # the agent goes on: still the main line


SUMMARY = ("POLAR-SUMMARY: the user asked to read big.txt with the shell tool and report; it was read "
           "twice and is plain filler text.")


@pytest.mark.timeout(1200)
def test_real_opencode_compaction_on_a_small_window(log_dir, redis_url, tmp_path):
    """opencode told a 24k window compacts by itself once its prompt passes window - output: the
    stand-in reads a ~5k-token file turn after turn, answers opencode's summary request (a separate
    conversation) with SUMMARY and its "Continue if you have next steps" turn with a final text.
    The summary call is a trainable trace; the conversation after it continues from it."""
    from polar_mq.harnesses.limits import ModelLimits
    from polar_mq.merge.agents import COMPACTION_REQUESTS

    binary = cli_bin("opencode")
    done = "All parts are read; nothing else is left to do."
    reads = [{"tool": "bash", "arguments": {"command": "cat big.txt", "description": "read big.txt"}}] * 6
    script = tmp_path / "steps.json"
    script.write_text(json.dumps([{"when": "Create a new anchored summary", "text": SUMMARY},
                                  {"when": "Continue if you have next steps", "text": done}]
                                 + reads + [{"text": done}]))
    ms = start_model_server(log_dir, "--scripted", str(script), "--max-model-len", "131072", name="ms-oc-compact")
    gw = start_gateway(log_dir, redis_url, [ms.url], name="gw-oc-compact")
    try:
        handle = GatewayHandle(url=gw.url, upstream_url=ms.url, redis_url=redis_url, server=gw)
        sess = handle.new_session()
        home, work = tmp_path / "home", tmp_path / "work"
        work.mkdir()
        (work / "big.txt").write_text("".join(f"line {i:04d}: polar bears read filler text so that the "
                                              "window fills up\n" for i in range(200)))
        launch = opencode.configure(home, sess["base_urls"], sess["key"], "stand-in",
                                    "Read big.txt with the shell tool, part by part, then report.", bin=binary,
                                    limits=ModelLimits(24000, 2000, "task"))
        proc = subprocess.run(launch.argv, env={**os.environ, **launch.env}, cwd=work,
                              stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300)
        calls = {c["call_id"]: c for c in handle.calls(sess["session_id"])}
        for builder in ("prefix_merging", "per_request"):
            traj = handle.trajectory(sess["session_id"], builder)
            traces = traj["traces"]
            summaries = [i for i, t in enumerate(traces) if t["metadata"].get("compaction_summary")]
            assert summaries, (proc.returncode, proc.stderr[-1500:], traj["stats"])
            s = traces[summaries[-1]]
            call = calls[s["metadata"]["compaction_summary"]["call_id"]]
            assert any(p in json.dumps(call["messages"][-1]) for p in COMPACTION_REQUESTS)
            assert SUMMARY in (call["response_message"] or {}).get("content", "")
            assert sum(s["loss_mask"]) >= len(call["completion_token_ids"]) > 0  # kept, trainable
            after = [t for t in traces if t["metadata"].get("continues_from")]
            assert after, traj["stats"]
            for t in after:
                assert t["metadata"]["continues_from"] == {"trace_index": summaries[-1], "reason": "compaction"}
                assert SUMMARY in json.dumps(calls[t["call_ids"][0]]["messages"])
            assert traj["stats"]["compactions"] >= 1 and traj["stats"]["origins"]["compaction"] >= 1
        assert proc.returncode == 0, proc.stderr[-1500:]
    finally:
        stop(gw.proc)
        stop(ms.proc)
