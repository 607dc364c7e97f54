"""Namespace tools in the Responses API (Codex 0.171 declares its sub-agent tools as the
namespace ``multi_agent_v1``): the model sees each as a function ``NAMESPACE.NAME``, the answer's
call goes back as ``{"name", "namespace"}`` (what Codex routes: a bare ``spawn_agent`` is
"unsupported call"), and Codex's echo of it renders as the model's own call. The real Codex run:
tests/replays/lineage/codex/subagent.json (tests/merge/test_lineage_replays.py)."""

from __future__ import annotations

import json

from polar_mq.proxy_app.adapters import openai_responses as ad
from tests.adapters.test_openai_responses import call, events_of, result

SPAWN = {"type": "function", "name": "spawn_agent", "description": "Spawn a sub-agent.",
         "parameters": {"type": "object", "properties": {"message": {"type": "string"}}, "required": ["message"]},
         "strict": False}
NAMESPACE = {"type": "namespace", "name": "multi_agent_v1", "description": "Sub-agents.",
             "tools": [SPAWN, {**SPAWN, "name": "wait_agent"}]}
EXEC = {"type": "function", "name": "exec_command", "parameters": {"type": "object", "properties": {}}}


def test_namespace_tools_reach_the_model_as_dotted_functions():
    req = ad.to_chat({"model": "m", "input": "go", "tools": [EXEC, NAMESPACE]})
    names = [t["function"]["name"] for t in req.tools]
    assert names == ["exec_command", "multi_agent_v1.spawn_agent", "multi_agent_v1.wait_agent"]
    assert req.tools[1]["function"]["parameters"] == SPAWN["parameters"]


def test_a_dotted_call_answers_as_namespace_and_name_and_its_echo_renders_back():
    req = ad.to_chat({"model": "m", "input": "go", "tools": [EXEC, NAMESPACE]})
    args = json.dumps({"message": "count lines"})
    res = result(None, tool_calls=[call("multi_agent_v1.spawn_agent", args, "c1"), call("exec_command", "{}", "c2")],
                 finish="tool_calls")
    items = [i for i in ad.from_chat(res, req)["output"] if i["type"] == "function_call"]
    assert [(i["name"], i.get("namespace")) for i in items] == [("spawn_agent", "multi_agent_v1"),
                                                                ("exec_command", None)]
    stream_req = ad.to_chat({"model": "m", "input": "go", "tools": [NAMESPACE], "stream": True})
    done = [e["item"] for e in events_of(ad.stream_events(res, stream_req)) if e["type"] == "response.output_item.done"]
    assert {(i["name"], i.get("namespace")) for i in done if i["type"] == "function_call"} == {
        ("spawn_agent", "multi_agent_v1"), ("exec_command", None)}
    # Codex echoes the call with its namespace: the history shows the call the model made
    echo = ad.to_chat({"model": "m", "tools": [NAMESPACE], "input": [
        {"type": "message", "role": "user", "content": "go"},
        {"type": "function_call", "call_id": "c1", "name": "spawn_agent", "namespace": "multi_agent_v1",
         "arguments": args},
        {"type": "function_call_output", "call_id": "c1", "output": "{\"agent_id\": \"a1\"}"}]})
    assert echo.messages[1]["tool_calls"][0]["function"]["name"] == "multi_agent_v1.spawn_agent"
