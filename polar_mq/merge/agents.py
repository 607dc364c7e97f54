"""What real agents do beyond one linear conversation: sub-agents and compaction, read from the
messages each harness sends (the strings below come from the pinned CLIs' own sources; see
docs/lineage.md for where each was found).

- A *sub-agent* is started by a tool call (Claude Code ``Agent``/``Task``, opencode ``task``,
  Qwen Code ``agent``, Gemini CLI ``invoke_agent``, Codex ``spawn_agent``; pi has none): its
  conversation opens with the tool call's prompt as a user message.
- *Compaction*: a call asks the model to summarise the history (the summary request), and a new
  conversation starts from that summary (the continuation).

Every decision uses only the calls in canonical order (records.py: started_at, call id), so the
links never depend on the order records arrived in (tests/merge/test_merge_lineage.py's property test).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Iterable

from polar_mq.merge.messages import SYSTEM_ROLES, _text, dialogue_keys
from polar_mq.merge.records import Call

# Sub-agent tools by name -> the argument keys that hold the child's opening prompt.
SUBAGENT_TOOLS: dict[str, tuple[str, ...]] = {
    "Agent": ("prompt",),  # Claude Code 2.1.x
    "Task": ("prompt",),  # Claude Code before 2.1 (same input)
    "task": ("prompt",),  # opencode
    "agent": ("prompt",),  # Qwen Code 0.15
    "invoke_agent": ("prompt",),  # Gemini CLI
    "spawn_agent": ("message", "items"),  # Codex (namespace multi_agent_v1)
}
# A prompt this short is matched only exactly (containment would link unrelated chains).
MIN_CONTAINED_PROMPT = 16

# The last user message of a summary request contains one of these.
COMPACTION_REQUESTS: tuple[str, ...] = (
    "Your task is to create a detailed summary of the conversation so far",  # Claude Code
    "Create a new anchored summary from the conversation history",  # opencode
    "Construct a new summary that combines both",  # opencode, with a prior summary
    "First, reason in your scratchpad. Then, generate the",  # Qwen Code, Gemini CLI
    # Gemini CLI 0.61 then asks for a verified summary; its answer is what the continuation opens with
    "Critically evaluate the <state_snapshot> you just generated",
    "You are performing a CONTEXT CHECKPOINT COMPACTION",  # Codex
    "The messages above are a conversation to summarize",  # pi
    "The messages above are NEW conversation messages to incorporate into the existing summary",  # pi
    "This is the PREFIX of a turn that was too large to keep",  # pi, when the cut splits a turn
)
# A conversation that starts from a summary carries one of these in its opening messages.
COMPACTION_CONTINUATIONS: tuple[str, ...] = (
    "This session is being continued from a previous conversation that ran out of context",  # Claude Code
    "<conversation-checkpoint>",  # opencode (v2 sessions)
    "Got it. Thanks for the additional context!",  # Qwen Code, Gemini CLI (the model's ack)
    "Another language model started to solve this problem and produced a summary",  # Codex
    "The conversation history before this point was compacted into the following summary",  # pi
)
# opencode's classic sessions replay the compaction as this user message, then the summary.
COMPACTION_CONTINUATION_MESSAGES = frozenset({"What did we do so far?"})
OPENING_MESSAGES = 4  # non-system messages of a conversation's opening searched for markers


@dataclass(frozen=True)
class Spawn:
    """A sub-agent tool call in a call's answer."""

    call: int  # index of the call whose answer holds the tool call
    started_at: float
    position: int  # its position among that answer's tool calls
    tool_call_id: str
    tool: str
    prompt: str


def _tool_name(name: str) -> str:
    """Codex namespaces its tools (``multi_agent_v1.spawn_agent``): the last part names it."""
    for sep in (".", "__", "/"):
        if sep in name:
            name = name.rsplit(sep, 1)[-1]
    return name


def _arguments(raw: Any) -> dict[str, Any]:
    if isinstance(raw, dict):
        return raw
    if isinstance(raw, str) and raw.strip():
        try:
            value = json.loads(raw)
        except ValueError:
            return {}
        return value if isinstance(value, dict) else {}
    return {}


def _prompt(args: dict[str, Any], keys: tuple[str, ...]) -> str:
    for key in keys:
        value = args.get(key)
        if isinstance(value, str) and value.strip():
            return value.strip()
        if isinstance(value, list):  # Codex `items`: [{"type": "text", "text": ...}]
            text = "".join(str(v.get("text") or "") for v in value if isinstance(v, dict)).strip()
            if text:
                return text
    return ""


def find_spawns(calls: list[Call]) -> list[Spawn]:
    """Every sub-agent tool call with a prompt, in canonical order."""
    out = []
    for call in calls:
        for pos, tc in enumerate((call.record.response_message or {}).get("tool_calls") or []):
            if not isinstance(tc, dict):
                continue
            fn: dict[str, Any] = tc["function"] if isinstance(tc.get("function"), dict) else tc
            name = _tool_name(str(fn.get("name") or ""))
            keys = SUBAGENT_TOOLS.get(name)
            if keys is None:
                continue
            prompt = _prompt(_arguments(fn.get("arguments", fn.get("input"))), keys)
            if prompt:
                out.append(Spawn(call.index, call.started_at, pos, str(tc.get("id") or ""), name,
                                 prompt))
    return out


def opening_texts(call: Call) -> list[tuple[str, str]]:
    """(role, text) of the first non-system messages of the call's conversation."""
    out = []
    for m in call.record.messages or []:
        if m.get("role") in SYSTEM_ROLES:
            continue
        out.append((str(m.get("role")), _text(m.get("content"))))
        if len(out) >= OPENING_MESSAGES:
            break
    return out


def _user_opening(call: Call) -> list[str]:
    """The user messages of the conversation's opening: Codex sends its environment context as
    user messages ahead of the task; Qwen Code's sub-agent opens with its environment context, the
    acknowledgement "Got it. Thanks for the context!", then the task
    (tests/merge/test_lineage_replays.py, qwen_code/subagent)."""
    return [text for role, text in opening_texts(call) if role == "user"]


def _match(spawn: Spawn, texts: list[str]) -> int:
    """2: a user message is the prompt; 1: one contains it (a harness wraps it); 0: no."""
    if any(t == spawn.prompt for t in texts):
        return 2
    if len(spawn.prompt) >= MIN_CONTAINED_PROMPT and any(spawn.prompt in t for t in texts):
        return 1
    return 0


def link_spawns(heads: Iterable[Call], spawns: list[Spawn]) -> dict[int, Spawn]:
    """Head call index -> the sub-agent tool call that started its conversation. Heads are taken
    in canonical order; each takes the earliest unused spawn that did not start after it (equal
    clocks allowed: the call id is no order in time), exact matches first, so two identical
    prompts go to their children in start order."""
    used: set[tuple[int, int]] = set()
    out: dict[int, Spawn] = {}
    for head in sorted(heads, key=lambda c: c.index):
        texts = _user_opening(head)
        if not texts:
            continue
        best: Spawn | None = None
        best_score = 0
        for sp in spawns:
            if sp.call == head.index or sp.started_at > head.started_at or (sp.call, sp.position) in used:
                continue
            score = _match(sp, texts)
            if score > best_score:
                best, best_score = sp, score
        if best is not None:
            used.add((best.call, best.position))
            out[head.index] = best
    return out


def result_call(calls: list[Call], spawn: Spawn) -> Call | None:
    """The first call after the spawn whose messages carry the tool result back to the parent."""
    if not spawn.tool_call_id:
        return None
    for call in calls:
        if call.index == spawn.call or call.started_at < spawn.started_at:
            continue
        for m in call.record.messages or []:
            if m.get("role") == "tool" and m.get("tool_call_id") == spawn.tool_call_id:
                return call
    return None


# --- compaction ---------------------------------------------------------------------------------
def _last_user_text(call: Call) -> str:
    for m in reversed(call.record.messages or []):
        if m.get("role") == "user":
            return _text(m.get("content"))
    return ""


def is_summary_request(call: Call) -> bool:
    text = _last_user_text(call)
    return any(marker in text for marker in COMPACTION_REQUESTS)


def _probe(call: Call) -> str:
    """A line of the summary the continuation is expected to repeat verbatim (harnesses reformat
    the summary's wrapper tags, not its lines): the longest line, when long enough."""
    text = _text((call.record.response_message or {}).get("content"))
    lines = sorted((ln.strip() for ln in text.splitlines()), key=len, reverse=True)
    return lines[0] if lines and len(lines[0]) >= 24 else ""


def _continues_by_marker(call: Call) -> bool:
    for _role, text in opening_texts(call):
        if text in COMPACTION_CONTINUATION_MESSAGES:
            return True
        if any(marker in text for marker in COMPACTION_CONTINUATIONS):
            return True
    return False


def link_compactions(heads: Iterable[Call], summaries: list[Call]) -> dict[int, Call]:
    """Head call index -> the summary call its conversation starts from: the latest earlier
    summary whose text it repeats, else (a harness marker only) the latest earlier summary."""
    out: dict[int, Call] = {}
    probes = {s.index: _probe(s) for s in summaries}
    for head in heads:
        earlier = [s for s in summaries if s.index != head.index and s.started_at <= head.started_at]
        if not earlier:
            continue
        opening = "\n".join(text for _role, text in opening_texts(head))
        by_text = [s for s in earlier if probes[s.index] and probes[s.index] in opening]
        if by_text:
            out[head.index] = by_text[-1]
        elif _continues_by_marker(head):
            out[head.index] = earlier[-1]
    return out


def summarized_call(calls: list[Call], summary: Call, exclude: set[int]) -> Call | None:
    """The call whose conversation (with its answer) the summary request replays, when the
    request carries the history as messages (Claude Code, Qwen Code, Gemini CLI, Codex, pi):
    the latest earlier call whose dialogue is the longest prefix of the request's."""
    mine = dialogue_keys(summary.record, False)
    best, best_len = None, 0
    for other in calls[:summary.index]:
        if other.index in exclude:
            continue
        theirs = dialogue_keys(other.record, True)
        if 2 <= len(theirs) <= len(mine) and mine[:len(theirs)] == theirs and len(theirs) >= best_len:
            best, best_len = other, len(theirs)
    return best
