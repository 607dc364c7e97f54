"""The stand-in model's "brain": pure functions that decide the assistant reply from a request.

Default policy (see :func:`decide`):

* tools declared and no tool result since the last real user message -> call ONE tool (prefer a
  file-writing tool, else a shell tool, else the first tool), arguments filled from its schema;
* after a tool result -> ``Done: the tool returned <first 60 chars>.``;
* no tools -> ``Hello from the stand-in model. You said: <first 80 chars>``.

Directives anywhere in the latest user text: ``polar:sleep=S``, ``polar:think``,
``polar:parallel``, ``polar:notool``, ``polar:long``, ``polar:json``, ``polar:fail=CODE``,
``polar:say=TEXT`` (to end of line), ``polar:path=P``.

A scripted run (``--scripted FILE.json``) is a list of steps ``{"tool": name, "arguments": {...}}``
| ``{"tool_calls": [{"name", "arguments"}, ...]}`` | ``{"text": "..."}`` (each optionally with
``"reasoning"``); step k answers the k-th assistant turn after the last real user message. A step
with ``"when": TEXT`` is a rule, not a position: it answers every request whose latest user text
contains TEXT (the first such rule wins), e.g. a harness's compaction prompt, so a scripted agent
can be made to summarise and then finish (tests/dev/test_model_server.py::test_scripted_when_rules).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

DEFAULT_PATH = "polar.txt"
DEFAULT_CONTENT = "hello from polar"

WRITE_NAMES = {
    "write", "write_file", "writefile", "create_file", "createfile", "file_write", "write_to_file",
    "writetofile", "create", "save_file",
}
SHELL_NAMES = {
    "bash", "shell", "exec_command", "run_shell_command", "shell_command", "exec", "run_command",
    "execute_command", "terminal", "local_shell", "run_terminal_cmd", "execute_bash",
}
PATH_KEYS = {
    "path", "file_path", "filepath", "file", "filename", "file_name", "absolute_path", "target_file",
    "target", "dest", "destination", "notebook_path",
}
CONTENT_KEYS = {"content", "contents", "text", "file_text", "data", "body", "new_str", "new_string"}
COMMAND_KEYS = {"command", "cmd", "commands", "script", "cmdline", "shell_command"}


@dataclass
class ToolCallSpec:
    name: str
    arguments: dict[str, Any]


@dataclass
class Reply:
    content: str = ""
    reasoning: str | None = None
    tool_calls: list[ToolCallSpec] = field(default_factory=list)
    sleep: float = 0.0
    fail: int | None = None
    fail_message: str | None = None


# ---- request inspection ---------------------------------------------------------------------

def content_text(content: Any) -> str:
    """Text of an OpenAI message content (string or list of parts)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        out = []
        for part in content:
            if isinstance(part, str):
                out.append(part)
            elif isinstance(part, dict) and isinstance(part.get("text"), str):
                out.append(part["text"])
        return "\n".join(out)
    return str(content)


def last_user_index(messages: list[dict]) -> int:
    for i in range(len(messages) - 1, -1, -1):
        if isinstance(messages[i], dict) and messages[i].get("role") == "user":
            return i
    return -1


def tool_functions(tools: list[dict] | None) -> list[dict]:
    """Normalise tool declarations to ``{"name", "parameters"}`` (function tools only)."""
    out = []
    for t in tools or []:
        if not isinstance(t, dict):
            continue
        fn = t.get("function") if isinstance(t.get("function"), dict) else None
        if fn is None and t.get("type") not in (None, "function"):
            continue
        fn = fn or t
        name = fn.get("name")
        if not isinstance(name, str) or not name:
            continue
        params = fn.get("parameters") or fn.get("input_schema") or fn.get("parametersJsonSchema") or {}
        out.append({"name": name, "parameters": params if isinstance(params, dict) else {}})
    return out


@dataclass
class Directives:
    sleep: float = 0.0
    think: bool = False
    parallel: bool = False
    notool: bool = False
    long: bool = False
    json: bool = False
    fail: int | None = None
    say: str | None = None
    path: str | None = None


_SLEEP = re.compile(r"polar:sleep=([0-9]*\.?[0-9]+)")
_FAIL = re.compile(r"polar:fail=([0-9]{3})")
_SAY = re.compile(r"polar:say=([^\r\n]*)")
_PATH = re.compile(r"polar:path=(\S+)")


def parse_directives(text: str) -> Directives:
    d = Directives()
    if "polar:" not in text:
        return d
    m = _SLEEP.search(text)
    if m:
        d.sleep = float(m.group(1))
    m = _FAIL.search(text)
    if m:
        d.fail = int(m.group(1))
    m = _SAY.search(text)
    if m:
        d.say = m.group(1)
    m = _PATH.search(text)
    if m:
        d.path = m.group(1)
    d.think = "polar:think" in text
    d.parallel = "polar:parallel" in text
    d.notool = "polar:notool" in text
    d.long = "polar:long" in text
    d.json = "polar:json" in text
    return d


# ---- argument synthesis ---------------------------------------------------------------------

def _first_type(schema: dict) -> str | None:
    t = schema.get("type")
    if isinstance(t, list):
        t = next((x for x in t if x != "null"), None)
    if t is None:
        for key in ("anyOf", "oneOf"):
            for sub in schema.get(key) or []:
                if isinstance(sub, dict) and sub.get("type") not in (None, "null"):
                    return _first_type(sub)
        if "properties" in schema:
            return "object"
        if "enum" in schema and schema["enum"]:
            v = schema["enum"][0]
            return {str: "string", bool: "boolean", int: "integer", float: "number"}.get(type(v), "string")
    return t if isinstance(t, str) else None


def _norm_key(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


def _is_path_key(name: str) -> bool:
    n = _norm_key(name)
    return n in {_norm_key(k) for k in PATH_KEYS} or n.endswith("path")


def _is_content_key(name: str) -> bool:
    return _norm_key(name) in {_norm_key(k) for k in CONTENT_KEYS}


def _is_command_key(name: str) -> bool:
    return _norm_key(name) in {_norm_key(k) for k in COMMAND_KEYS}


def value_for(name: str, schema: dict, path: str, depth: int = 0) -> Any:
    """A plausible value for one property."""
    schema = schema if isinstance(schema, dict) else {}
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return schema["enum"][0]
    t = _first_type(schema)
    if _is_command_key(name):
        cmd = f"echo {DEFAULT_CONTENT} > {path}"
        if t == "array":
            return ["bash", "-lc", cmd]
        return cmd
    if t in (None, "string"):
        if _is_path_key(name):
            return path
        if _is_content_key(name):
            return DEFAULT_CONTENT
        return "x"
    if t == "integer":
        return 1
    if t == "number":
        return 1
    if t == "boolean":
        return False
    if t == "array":
        return []
    if t == "object":
        if depth < 3 and schema.get("required"):
            return fill_arguments(schema, path, depth + 1)
        return {}
    return "x"


def fill_arguments(schema: dict, path: str = DEFAULT_PATH, depth: int = 0) -> dict[str, Any]:
    """Arguments for a tool: its required properties (or, without any, the path/content/command
    ones it declares)."""
    props = schema.get("properties") if isinstance(schema, dict) else None
    props = props if isinstance(props, dict) else {}
    required = [r for r in (schema.get("required") or []) if isinstance(r, str)] if isinstance(schema, dict) else []
    names = required or [
        k for k in props if _is_path_key(k) or _is_content_key(k) or _is_command_key(k)
    ]
    return {k: value_for(k, props.get(k) or {}, path, depth) for k in names}


def choose_tool(tools: list[dict]) -> dict:
    """Prefer a file-writing tool, then a shell tool, then the first tool."""
    for t in tools:
        if t["name"].lower() in WRITE_NAMES:
            return t
    for t in tools:
        n = t["name"].lower()
        if "todo" not in n and re.search(r"(^|[_\-.])(write|create)[_\-]?file($|[_\-.])", n):
            return t
    for t in tools:
        if t["name"].lower() in SHELL_NAMES:
            return t
    for t in tools:
        n = t["name"].lower()
        if "shell" in n or "bash" in n:
            return t
    return tools[0]


def _second_path(path: str) -> str:
    stem, dot, ext = path.rpartition(".")
    if dot and stem and "/" not in ext:
        return f"{stem}2.{ext}"
    return path + "2"


# ---- texts ----------------------------------------------------------------------------------

def _clip(text: str, n: int) -> str:
    return " ".join(text.split())[:n]


def long_text() -> str:
    parts = []
    for i in range(1, 61):
        parts.append(f"Line {i}: the stand-in model keeps talking so that max_tokens cuts it off.")
    return "\n".join(parts)


def json_for_response_format(response_format: dict | None) -> str | None:
    if not isinstance(response_format, dict):
        return None
    kind = response_format.get("type")
    if kind == "json_object":
        return json.dumps({"answer": DEFAULT_CONTENT}, ensure_ascii=False)
    if kind == "json_schema":
        js = response_format.get("json_schema") or {}
        schema = js.get("schema") if isinstance(js, dict) else None
        schema = schema if isinstance(schema, dict) else {}
        return json.dumps(_json_value(schema, 0), ensure_ascii=False)
    return None


def _json_value(schema: dict, depth: int) -> Any:
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return schema["enum"][0]
    t = _first_type(schema) or "object"
    if t == "object":
        props = schema.get("properties") or {}
        if depth > 4:
            return {}
        return {k: _json_value(v if isinstance(v, dict) else {}, depth + 1) for k, v in props.items()}
    if t == "array":
        items = schema.get("items") if isinstance(schema.get("items"), dict) else None
        n = int(schema.get("minItems") or 0)
        return [_json_value(items or {}, depth + 1) for _ in range(n)]
    if t == "string":
        return DEFAULT_CONTENT
    if t in ("integer", "number"):
        return schema.get("minimum", 1)
    if t == "boolean":
        return False
    return None


# ---- decision -------------------------------------------------------------------------------

def decide(
    messages: list[dict],
    tools: list[dict] | None = None,
    *,
    tool_choice: Any = None,
    response_format: dict | None = None,
    scripted: list[dict] | None = None,
) -> Reply:
    """Decide the assistant reply for a chat request. Pure and deterministic."""
    messages = [m for m in messages if isinstance(m, dict)]
    ui = last_user_index(messages)
    user_text = content_text(messages[ui].get("content")) if ui >= 0 else ""
    d = parse_directives(user_text)
    after = messages[ui + 1:] if ui >= 0 else messages
    tool_result_seen = any(m.get("role") == "tool" for m in after)
    turn_index = sum(1 for m in after if m.get("role") == "assistant")
    fns = tool_functions(tools)
    if tool_choice == "none":
        fns_callable: list[dict] = []
    else:
        fns_callable = fns
    path = d.path or DEFAULT_PATH

    reply = Reply(sleep=d.sleep, fail=d.fail)
    if d.fail is not None:
        reply.fail_message = f"Scripted failure (polar:fail={d.fail})."
        return reply

    if d.say is not None:
        reply.content = d.say
    elif scripted is not None and (rule := _rule_for(scripted, user_text)) is not None:
        _apply_step(reply, rule, fns)
    elif scripted is not None and turn_index < len(steps := _positional(scripted)):
        _apply_step(reply, steps[turn_index], fns)
    elif (
        fns_callable
        and not d.notool
        and (not tool_result_seen or tool_choice == "required")
        and not (scripted is not None and turn_index >= len(_positional(scripted)))
        and not (d.json and json_for_response_format(response_format) is not None)
    ):
        tool = _forced_tool(tool_choice, fns_callable) or choose_tool(fns_callable)
        reply.tool_calls.append(ToolCallSpec(tool["name"], fill_arguments(tool["parameters"], path)))
        if d.parallel:
            reply.tool_calls.append(
                ToolCallSpec(tool["name"], fill_arguments(tool["parameters"], _second_path(path)))
            )
    else:
        js = json_for_response_format(response_format)
        if js is not None:
            reply.content = js
        elif d.long:
            reply.content = long_text()
        elif tool_result_seen:
            last_tool = next(m for m in reversed(after) if m.get("role") == "tool")
            reply.content = f"Done: the tool returned {_clip(content_text(last_tool.get('content')), 60)}."
        else:
            reply.content = f"Hello from the stand-in model. You said: {_clip(user_text, 80)}"
    if d.think and reply.reasoning is None:
        reply.reasoning = f"The user wrote: {_clip(user_text, 40)}. I will answer deterministically."
    return reply


def _is_rule(step: Any) -> bool:
    return isinstance(step, dict) and isinstance(step.get("when"), str)


def _positional(scripted: list[dict]) -> list[dict]:
    return [s for s in scripted if not _is_rule(s)]


def _rule_for(scripted: list[dict], user_text: str) -> dict | None:
    return next((s for s in scripted if _is_rule(s) and s["when"] in user_text), None)


def _forced_tool(tool_choice: Any, fns: list[dict]) -> dict | None:
    if isinstance(tool_choice, dict):
        fn = tool_choice.get("function") if isinstance(tool_choice.get("function"), dict) else tool_choice
        name = fn.get("name")
        for t in fns:
            if t["name"] == name:
                return t
    return None


def _apply_step(reply: Reply, step: dict, fns: list[dict]) -> None:
    if not isinstance(step, dict):
        reply.content = str(step)
        return
    if isinstance(step.get("reasoning"), str):
        reply.reasoning = step["reasoning"]
    calls = []
    if "tool" in step:
        calls.append({"name": step["tool"], "arguments": step.get("arguments")})
    for c in step.get("tool_calls") or []:
        if isinstance(c, dict):
            fn = c.get("function") if isinstance(c.get("function"), dict) else c
            calls.append({"name": fn.get("name"), "arguments": fn.get("arguments")})
    for c in calls:
        args = c.get("arguments")
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except ValueError:
                args = {}
        if args is None:
            schema = next((t["parameters"] for t in fns if t["name"] == c["name"]), {})
            args = fill_arguments(schema)
        reply.tool_calls.append(ToolCallSpec(str(c["name"]), args if isinstance(args, dict) else {}))
    if isinstance(step.get("text"), str):
        reply.content = step["text"]
    elif isinstance(step.get("content"), str):
        reply.content = step["content"]


def load_script(path: str) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    if isinstance(data, dict) and isinstance(data.get("steps"), list):
        data = data["steps"]
    if not isinstance(data, list):
        raise ValueError("scripted file must hold a JSON list of steps")
    return data
