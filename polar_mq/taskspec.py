"""TaskRequest: what a user submits, parsed and validated in one place (API, CLI and client).

Validation errors name the field (`agent.harness`, `runtime.prepare[2].cmd`) so the API can answer
a JSON problem-details 400 that says exactly what to fix.

Tests: tests/api/test_api.py.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any

from polar_mq import sampling

HARNESSES = ("claude_code", "codex", "gemini_cli", "qwen_code", "opencode", "pi", "shell")
BACKENDS = ("auto", "docker", "apptainer", "bwrap", "local")  # auto: the safest one the worker has
BUILDERS = ("per_request", "prefix_merging")
# how a session's reward reaches its chains (merge/rewards.py; CONTRACT "Agent lineage")
REWARD_SCOPES = ("session", "split", "root")
PRIORITY_LIMIT = 1_000_000  # dispatch_priority bound (any order fits; the broker buckets it, tasks/priority.py)


class ValidationError(ValueError):
    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


@dataclass
class AgentSpec:
    harness: str
    model: str = "policy"
    options: dict[str, Any] = field(default_factory=dict)
    # The sampling policy the gateway enforces on every call of the task (polar_mq/sampling.py).
    sampling: dict[str, Any] = field(default_factory=dict)


@dataclass
class RuntimeSpec:
    backend: str = "auto"
    image: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    workdir: str | None = None
    prepare: list[dict[str, Any]] = field(default_factory=list)
    cpus: float | None = None
    memory_mb: int | None = None
    allow_internet: bool = False
    gpus: int | None = None
    keep_workdir: bool = False  # keep the session's work dir and HOME after postrun (default: removed)


@dataclass
class StrategySpec:
    strategy: str
    config: dict[str, Any] = field(default_factory=dict)


@dataclass
class TaskRequest:
    instruction: str
    agent: AgentSpec
    task_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    num_samples: int = 1
    timeout_seconds: float = 600.0
    runtime: RuntimeSpec = field(default_factory=RuntimeSpec)
    builder: StrategySpec = field(default_factory=lambda: StrategySpec("prefix_merging"))
    grader: StrategySpec = field(default_factory=lambda: StrategySpec("completion"))
    callback_url: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    # Once this many sessions are graded without ERROR, the others are cancelled (tasks/early_stop.py).
    early_stop_min_usable_sessions: int | None = None
    # Higher first, across tasks, for init and READY (tasks/priority.py).
    dispatch_priority: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def fingerprint(self) -> str:
        """Identity of the request body for idempotent resubmits (task_id excluded)."""
        body = {k: v for k, v in self.to_dict().items() if k != "task_id"}
        # Tasks stored before these fields existed keep their fingerprint while they are unset.
        if not body["agent"].get("sampling"):
            body["agent"].pop("sampling", None)
        if not body["runtime"].get("keep_workdir"):
            body["runtime"].pop("keep_workdir", None)
        for name in ("early_stop_min_usable_sessions", "dispatch_priority"):
            if not body.get(name):
                body.pop(name, None)
        return hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()


def _get(data: dict[str, Any], name: str, typ: type | tuple[type, ...], where: str, *, required: bool = False,
         default: Any = None) -> Any:
    label = f"{where}{name}"
    if name not in data or data[name] is None:
        if required:
            raise ValidationError(label, "is required")
        return default
    value = data[name]
    types = typ if isinstance(typ, tuple) else (typ,)
    if isinstance(value, bool) and bool not in types:
        raise ValidationError(label, f"must be {' or '.join(t.__name__ for t in types)}, got bool")
    if not isinstance(value, types):
        raise ValidationError(label, f"must be {' or '.join(t.__name__ for t in types)}, "
                                     f"got {type(value).__name__}")
    return value


def _no_unknown(data: dict[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise ValidationError(f"{where}{unknown[0]}", f"unknown field (allowed: {', '.join(sorted(allowed))})")


def _strategy(data: Any, where: str, default: str, choices: tuple[str, ...] | None) -> StrategySpec:
    if data is None:
        return StrategySpec(default)
    if isinstance(data, str):
        data = {"strategy": data}
    if not isinstance(data, dict):
        raise ValidationError(where.rstrip("."), "must be an object with 'strategy'")
    _no_unknown(data, {"strategy", "config"}, where)
    strategy = _get(data, "strategy", str, where, required=True)
    if choices and strategy not in choices and ":" not in strategy:
        raise ValidationError(f"{where}strategy", f"unknown {strategy!r}; use one of {', '.join(choices)} "
                                                 f"or 'module:Class'")
    config = _get(data, "config", dict, where, default={})
    if where == "builder." and strategy in BUILDERS:
        _check_builder_config(strategy, config)
    return StrategySpec(strategy, config)


def _check_builder_config(strategy: str, config: dict[str, Any]) -> None:
    """What a built-in builder's config shares, checked at submit: `reward_scope` (the builders
    check the rest of their config when built; the API builds them at submit too: api/admission.py)."""
    scope = config.get("reward_scope", "session")
    if scope not in REWARD_SCOPES:
        raise ValidationError("builder.config.reward_scope",
                              f"reward_scope must be one of {', '.join(REWARD_SCOPES)}, got {scope!r}")


def parse_task(data: Any) -> TaskRequest:
    """A validated TaskRequest from JSON/YAML data; raises ValidationError naming the field."""
    if not isinstance(data, dict):
        raise ValidationError("body", "must be a JSON object")
    _no_unknown(data, {"task_id", "instruction", "num_samples", "timeout_seconds", "agent", "runtime",
                       "builder", "grader", "evaluator", "callback_url", "metadata",
                       "early_stop_min_usable_sessions", "dispatch_priority"}, "")
    task_id = _get(data, "task_id", str, "")
    if task_id is not None and not (0 < len(task_id) <= 128 and all(c.isalnum() or c in "-_." for c in task_id)):
        raise ValidationError("task_id", "must be 1-128 characters of letters, digits, '-', '_' or '.'")
    instruction = _get(data, "instruction", str, "", required=True)
    if not instruction.strip():
        raise ValidationError("instruction", "must not be empty")
    num_samples = _get(data, "num_samples", int, "", default=1)
    if not 1 <= num_samples <= 10_000:
        raise ValidationError("num_samples", "must be between 1 and 10000")
    early_stop = _get(data, "early_stop_min_usable_sessions", int, "")
    if early_stop is not None and not 1 <= early_stop <= num_samples:
        raise ValidationError("early_stop_min_usable_sessions",
                              f"must be between 1 and num_samples ({num_samples})")
    priority = _get(data, "dispatch_priority", int, "", default=0)
    if not -PRIORITY_LIMIT <= priority <= PRIORITY_LIMIT:
        raise ValidationError("dispatch_priority", f"must be between {-PRIORITY_LIMIT} and {PRIORITY_LIMIT}")
    timeout = _get(data, "timeout_seconds", (int, float), "", default=600.0)
    if timeout <= 0:
        raise ValidationError("timeout_seconds", "must be positive")

    agent_data = _get(data, "agent", dict, "", required=True)
    _no_unknown(agent_data, {"harness", "model", "options", "sampling"}, "agent.")
    harness = _get(agent_data, "harness", str, "agent.", required=True)
    if harness not in HARNESSES:
        raise ValidationError("agent.harness", f"unknown {harness!r}; use one of {', '.join(HARNESSES)}")
    options = _get(agent_data, "options", dict, "agent.", default={})
    if harness == "shell":
        command = options.get("command")
        if not isinstance(command, (str, list)) or not command:
            raise ValidationError("agent.options.command", "the shell harness needs a command (string or list)")
    try:
        policy = sampling.validate(agent_data.get("sampling"))
    except sampling.PolicyError as exc:
        raise ValidationError(exc.field, exc.message) from exc
    agent = AgentSpec(harness, _get(agent_data, "model", str, "agent.", default="policy"), options, policy)

    rt = _get(data, "runtime", dict, "", default={})
    _no_unknown(rt, {"backend", "image", "env", "workdir", "prepare", "cpus", "memory_mb",
                     "allow_internet", "gpus", "keep_workdir"}, "runtime.")
    backend = _get(rt, "backend", str, "runtime.", default="auto")
    if backend not in BACKENDS:
        raise ValidationError("runtime.backend", f"unknown {backend!r}; use one of {', '.join(BACKENDS)}")
    env = _get(rt, "env", dict, "runtime.", default={})
    for k, v in env.items():
        if not isinstance(v, str):
            raise ValidationError(f"runtime.env.{k}", "must be a string")
    prepare = _get(rt, "prepare", list, "runtime.", default=[])
    for i, step in enumerate(prepare):
        if not isinstance(step, dict) or not ({"exec", "upload", "write"} & set(step)):
            raise ValidationError(f"runtime.prepare[{i}]", "must be an object with 'exec', 'upload' or 'write'")
    runtime = RuntimeSpec(
        backend=backend, image=_get(rt, "image", str, "runtime."), env=env,
        workdir=_get(rt, "workdir", str, "runtime."), prepare=prepare,
        cpus=_get(rt, "cpus", (int, float), "runtime."), memory_mb=_get(rt, "memory_mb", int, "runtime."),
        allow_internet=_get(rt, "allow_internet", bool, "runtime.", default=False),
        gpus=_get(rt, "gpus", int, "runtime."),
        keep_workdir=_get(rt, "keep_workdir", bool, "runtime.", default=False))
    if backend in ("docker", "apptainer") and not runtime.image:
        raise ValidationError("runtime.image", f"is required for the {backend} backend")

    grader_data = data.get("grader", data.get("evaluator"))
    callback = _get(data, "callback_url", str, "")
    if callback is not None and not callback.startswith(("http://", "https://")):
        raise ValidationError("callback_url", "must be an http(s) URL")
    return TaskRequest(
        task_id=task_id or uuid.uuid4().hex, instruction=instruction, num_samples=num_samples,
        timeout_seconds=float(timeout), agent=agent, runtime=runtime,
        builder=_strategy(data.get("builder"), "builder.", "prefix_merging", BUILDERS),
        grader=_strategy(grader_data, "grader.", "completion", None),
        callback_url=callback, metadata=_get(data, "metadata", dict, "", default={}),
        early_stop_min_usable_sessions=early_stop, dispatch_priority=priority)


def task_from_dict(data: dict[str, Any]) -> TaskRequest:
    """Rebuild a stored (already validated) TaskRequest."""
    return TaskRequest(
        task_id=data["task_id"], instruction=data["instruction"], num_samples=data["num_samples"],
        timeout_seconds=data["timeout_seconds"], agent=AgentSpec(**data["agent"]),
        runtime=RuntimeSpec(**data["runtime"]), builder=StrategySpec(**data["builder"]),
        grader=StrategySpec(**data["grader"]), callback_url=data.get("callback_url"),
        metadata=data.get("metadata") or {},
        early_stop_min_usable_sessions=data.get("early_stop_min_usable_sessions"),
        dispatch_priority=int(data.get("dispatch_priority") or 0))
