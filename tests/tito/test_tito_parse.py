"""The token-in path's own parsing of sampled text (vLLM's hermes + <think> rules), plain and
streamed: streamed pieces always add up to the plain parse, whatever the chunking."""

from __future__ import annotations

import json

import pytest

from polar_mq.proxy_app.tito.parse import StreamParser, parse_text, to_message

CALL = '<tool_call>\n{"name": "write", "arguments": {"path": "a.txt", "content": "hé"}}\n</tool_call>'
SPECIAL = ["<tool_call>", "</tool_call>", "<think>", "</think>"]
CASES = {
    "text": ("Hello there.", True, (None, "Hello there.", [])),
    "call": (CALL, True, (None, None, [("write", {"path": "a.txt", "content": "hé"})])),
    "text_then_calls": ("Let me write.\n" + CALL + "\n" + CALL, True,
                        (None, "Let me write.\n", [("write", {"path": "a.txt", "content": "hé"})] * 2)),
    "reasoning": ("<think>\nI should write.\n</think>\n\n" + CALL, True,
                  ("I should write.", None, [("write", {"path": "a.txt", "content": "hé"})])),
    "broken_json": ("<tool_call>\n{not json}\n</tool_call>", True,
                    (None, "<tool_call>\n{not json}\n</tool_call>", [])),
    # a name that is no string (sampled by the Claude Code GRPO policy: Claude Code crashed on the
    # tool_use it became) is text, as in vLLM's hermes parser
    "name_not_a_string": ('<tool_call>\n{"name": {"command": "Bash"}, "arguments": {}}\n</tool_call>', True,
                          (None, '<tool_call>\n{"name": {"command": "Bash"}, "arguments": {}}\n</tool_call>', [])),
    "no_tools": ("Hi <tool_call>x</tool_call>", False, (None, "Hi x", [])),
    "partial_tag_text": ("a <tool", True, (None, "a <tool", [])),
}


def _view(msg: dict) -> tuple:
    calls = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in msg.get("tool_calls", [])]
    return (msg.get("reasoning"), msg.get("content"), calls)


@pytest.mark.parametrize("case", sorted(CASES))
def test_parse_like_vllm(case):
    text, tools, expected = CASES[case]
    assert _view(to_message(parse_text(text, tools, SPECIAL), [])) == expected


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("size", [1, 2, 5, 1000])
def test_stream_pieces_add_up(case, size):
    text, tools, _ = CASES[case]
    parser = StreamParser(tools, SPECIAL)
    reasoning, content, calls = "", "", {}
    cuts = list(range(size, len(text), size)) + [len(text)]
    for k, end in enumerate(cuts):
        for d in parser.step(text[:end], final=k == len(cuts) - 1):
            reasoning += d.get("reasoning", "")
            content += d.get("content", "")
            for tc in d.get("tool_calls", []):
                entry = calls.setdefault(tc["index"], {"id": tc.get("id"), "name": None, "args": ""})
                entry["name"] = tc.get("function", {}).get("name") or entry["name"]
                entry["args"] += tc.get("function", {}).get("arguments", "")
    whole = to_message(parse_text(text, tools, SPECIAL), [])
    assert (reasoning or None, content or None) == (whole.get("reasoning"), whole.get("content"))
    assert [(c["name"], c["args"]) for _, c in sorted(calls.items())] == \
        [(c["function"]["name"], c["function"]["arguments"]) for c in whole.get("tool_calls", [])]
