"""Simulated agent sessions recorded the way the gateway records them, for tests and benchmarks.

A conversation is rendered with a real chat template (any object with ``apply_chat_template``,
``render``, ``encode``, ``decode`` and ``eos_token_id``, e.g. the stand-in ``ChatTokenizer``): the
prompt ids are the template's, the sampled ids are the assistant body's ids plus the end-of-turn
token, exactly as an upstream would report them. Knobs reproduce what real harnesses do: retries,
forks, truncated turns, completions without the end-of-turn token, re-tokenisation drift, changed
system headers, side calls, sub-agents and failed calls. Every sampled token gets a unique
logprob so tests can check where each one ended up.
"""

from __future__ import annotations

import copy
import json
import random
from dataclasses import dataclass, field
from typing import Any, Protocol

from polar_mq.model import CaptureRecord

WORDS = ("the file build test error value config parser token merge chain prompt trace model "
         "session agent tool result output function return module import class list dict "
         "fix update check run read write search patch line step data node tree branch").split()
BASH_TOOL = {"type": "function", "function": {
    "name": "bash", "description": "Run a shell command.",
    "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}}}


class TemplateTokenizer(Protocol):
    eos_token_id: int

    def encode(self, text: str) -> list[int]: ...
    def decode(self, ids: list[int]) -> str: ...
    def render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
               add_generation_prompt: bool = True) -> str: ...


@dataclass
class Conversation:
    system: str
    tools: list[dict[str, Any]]
    messages: list[dict[str, Any]] = field(default_factory=list)  # without the system message

    def sent(self) -> list[dict[str, Any]]:
        return [{"role": "system", "content": self.system}, *self.messages]

    def fork(self) -> "Conversation":
        return Conversation(self.system, self.tools, copy.deepcopy(self.messages))


class SessionSim:
    def __init__(self, tok: TemplateTokenizer, seed: int = 0, session_id: str = "sess",
                 start: float = 1_700_000_000.0):
        self.tok = tok
        self.rng = random.Random(seed)
        self.session_id = session_id
        self.clock = start
        self.records: list[CaptureRecord] = []
        self._serial = 0
        self._ids = 0

    # ---- content -------------------------------------------------------------------------
    def words(self, n: int) -> str:
        return " ".join(self.rng.choice(WORDS) for _ in range(max(1, n)))

    def conversation(self, system: str = "You are a coding agent.", user: str | None = None,
                     tools: list[dict[str, Any]] | None = None) -> Conversation:
        conv = Conversation(system, [BASH_TOOL] if tools is None else tools)
        conv.messages.append({"role": "user", "content": user or self.words(12)})
        return conv

    def _tick(self) -> float:
        self.clock += 1.0 + self.rng.random()
        return self.clock

    def _id(self, prefix: str) -> str:
        self._ids += 1
        return f"{prefix}_{self.session_id}_{self._ids:05d}"

    def _body_ids(self, sent: list[dict[str, Any]], tools: list[dict[str, Any]], reply: dict[str, Any]) -> list[int]:
        """The assistant body exactly as the template renders it (minus the end-of-turn text)."""
        before = self.tok.render(sent, tools=tools or None, add_generation_prompt=True)
        after = self.tok.render(sent + [reply], tools=tools or None, add_generation_prompt=False)
        if not after.startswith(before):
            raise ValueError("template does not render history as a prefix")
        body = after[len(before):]
        eos_text = self.tok.decode([self.tok.eos_token_id])
        cut = body.rfind(eos_text)
        return self.tok.encode(body[:cut] if cut >= 0 else body)

    # ---- calls ---------------------------------------------------------------------------
    def turn(self, conv: Conversation, *, words: int = 10, tool_call: bool = True,
             result_words: int = 12, advance: bool = True, truncate: bool = False,
             no_eos: bool = False, drift: bool = False, logprobs: bool = True,
             tool: tuple[str, dict[str, Any]] | None = None, result: str | None = None,
             content: str | None = None) -> CaptureRecord:
        """One model call on ``conv``. With ``advance`` the answer and a tool result (or a user
        follow-up) are appended, so the next call extends this one. ``tool`` (name, arguments)
        replaces the bash call, ``result`` the tool result's text, ``content`` the answer's text."""
        sent = conv.sent()
        prompt = self.tok.encode(self.tok.render(sent, tools=conv.tools or None))
        reply: dict[str, Any] = {"role": "assistant",
                                 "content": self.words(words) if content is None else content}
        call_id = self._id("tc")
        if tool is not None or (tool_call and conv.tools):
            name, args = tool if tool is not None else ("bash", {"cmd": self.words(3)})
            reply["tool_calls"] = [{"id": call_id, "type": "function", "function": {
                "name": name, "arguments": json.dumps(args)}}]
        body = self._body_ids(sent, conv.tools, reply)
        finish = "tool_calls" if reply.get("tool_calls") else "stop"
        if truncate:
            body = body[:max(1, len(body) // 2)]
            reply = {"role": "assistant", "content": self.tok.decode(body)}
            finish, completion = "length", list(body)
        elif no_eos:
            completion = list(body)
        else:
            completion = body + [self.tok.eos_token_id]
        if drift:  # sampled a non-canonical tokenisation of the same text
            completion = self._split_first(completion)
        lps = [-(self._next_serial() / 1e6) for _ in completion]
        rec = CaptureRecord(
            session_id=self.session_id, provider="openai_chat", call_id=self._id("call"),
            started_at=self._tick(), messages=copy.deepcopy(sent), tools=list(conv.tools),
            response_message=copy.deepcopy(reply), prompt_token_ids=prompt,
            completion_token_ids=completion, completion_logprobs=lps if logprobs else [],
            finish_reason=finish, model_served="stand-in")
        self.records.append(rec)
        if advance:
            conv.messages.append(reply)
            if reply.get("tool_calls"):
                conv.messages.append({"role": "tool", "tool_call_id": call_id,
                                      "content": self.words(result_words) if result is None else result})
            else:
                conv.messages.append({"role": "user", "content": self.words(result_words)})
        return rec

    def failed(self, conv: Conversation) -> CaptureRecord:
        rec = CaptureRecord(session_id=self.session_id, provider="openai_chat",
                            call_id=self._id("call"), started_at=self._tick(),
                            messages=conv.sent(), tools=list(conv.tools), status="error",
                            error="upstream 500")
        self.records.append(rec)
        return rec

    def _next_serial(self) -> int:
        self._serial += 1
        return self._serial

    def _split_first(self, ids: list[int]) -> list[int]:
        """Replace the first multi-byte token by the tokens of its pieces: the same text, a
        different (non-canonical) tokenisation, as sampling sometimes produces."""
        for pos, tid in enumerate(ids):
            text = self.tok.decode([tid])
            if len(text) >= 2 and text.isalpha():
                pieces = [t for ch in text for t in self.tok.encode(ch)]
                if pieces != [tid]:
                    return ids[:pos] + pieces + ids[pos + 1:]
        return ids
