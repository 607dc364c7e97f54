"""The canonical data that flows through polar_mq.

Every module speaks these types: the gateway writes `CaptureRecord`s, the merge builders turn
them into `Trace`s inside a `Trajectory`, graders set rewards, exporters write them out. They are
plain dataclasses so that they serialise to msgpack/JSON with `to_dict` / `from_dict` and nothing
else (no pydantic on the hot path). Field names follow ../shared/CONTRACT.md.
"""

from __future__ import annotations

import dataclasses
import sys
import time
import uuid
from dataclasses import dataclass, field
from collections.abc import Sequence
from typing import Any, ClassVar, TypeVar

from polar_mq._io.token_ids import plain

if sys.version_info >= (3, 11):
    from enum import StrEnum
else:  # Python 3.10 (setup.py's floor): the same behaviour, spelled out
    from enum import Enum

    class StrEnum(str, Enum):
        def __str__(self) -> str:
            return str(self.value)

T = TypeVar("T", bound="Record")

# The provider APIs the gateway serves; also the keys of its adapter registry
# (proxy_app/adapters/registry.py) and the `provider` of every CaptureRecord.
PROVIDERS = ("anthropic", "openai_chat", "openai_responses", "gemini")


class SessionState(StrEnum):
    """Where a rollout session is. Members are strings ("READY" == SessionState.READY), so they
    go to Redis, JSON and msgpack as they are; which state may follow which is states.py's."""

    REGISTERED = "REGISTERED"
    INITIALIZING = "INITIALIZING"
    READY = "READY"
    RUNNING = "RUNNING"
    POST_RUN = "POST_RUN"
    BUILDING = "BUILDING"
    EVALUATING = "EVALUATING"
    COMPLETED = "COMPLETED"
    ERROR = "ERROR"
    TIMEOUT = "TIMEOUT"


# The states a session ends in; also a trajectory's `status` and a session's `outcome`.
TERMINAL_STATES = (SessionState.COMPLETED, SessionState.ERROR, SessionState.TIMEOUT)


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def _field_names(cls: type) -> tuple[str, ...]:
    """A dataclass's field names, read once per class: `dataclasses.fields` walks the fields
    each time, and the gateway asks on every call."""
    names = _FIELD_NAMES.get(cls)
    if names is None:
        names = _FIELD_NAMES[cls] = tuple(f.name for f in dataclasses.fields(cls))
    return names


class Record:
    """Mixin: lossless dict conversion that tolerates unknown keys (forward compatibility)."""

    _nested: ClassVar[dict[str, type[Record]]] = {}

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        nested = self._nested
        for name in _field_names(type(self)):
            value = getattr(self, name)
            if name in nested and value is not None:
                value = [v.to_dict() for v in value]
            out[name] = value
        return out

    @classmethod
    def from_dict(cls: type[T], data: dict[str, Any]) -> T:
        names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        kwargs = {k: v for k, v in data.items() if k in names}
        for name, typ in cls._nested.items():
            if kwargs.get(name) is not None:
                kwargs[name] = [v if isinstance(v, typ) else typ.from_dict(v) for v in kwargs[name]]
        return cls(**kwargs)


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


# The error of a call whose gateway process died while it was in flight (store/lost_calls.py);
# trajectories list such calls and the call that retried each (merge/lost.py).
GATEWAY_LOST = "gateway_lost"


@dataclass
class CaptureRecord(Record):
    """One model call as the gateway saw it: what the client sent, what went upstream, what came
    back, with the exact token ids and logprobs the upstream reported."""

    session_id: str
    provider: str
    call_id: str = field(default_factory=lambda: new_id("call"))
    stream: bool = False
    started_at: float = field(default_factory=time.time)
    latency_ms: float = 0.0
    model_requested: str | None = None
    model_served: str | None = None
    request: dict[str, Any] | None = None
    messages: list[dict[str, Any]] = field(default_factory=list)
    tools: list[dict[str, Any]] = field(default_factory=list)
    response_message: dict[str, Any] | None = None
    # A list, or at the gateway the TokenIds of the upstream's text (token_ids.py: counted and
    # stored without making 29k ints); to_dict gives a list either way.
    prompt_token_ids: Sequence[int] = field(default_factory=list)
    completion_token_ids: list[int] = field(default_factory=list)
    completion_logprobs: list[float] = field(default_factory=list)
    finish_reason: str | None = None
    status: str = "ok"
    error: str | None = None
    # Token-in continuation (CONTRACT "Token-in continuation"): the prompt was built from the
    # recorded ids of `parent_call_id`, the call whose conversation this one extends.
    tito: bool = False
    parent_call_id: str | None = None
    # Extensions beyond the contract (additive):
    params: dict[str, Any] = field(default_factory=dict)  # sampling parameters sent upstream
    # What the harness asked for, before the task's sampling policy (agent.sampling) was applied.
    requested_params: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # e.g. dropped server-side tools
    upstream_url: str | None = None
    usage: dict[str, Any] = field(default_factory=dict)
    retry_count: int = 0  # the client's own retry counter (x-stainless-retry-count)
    kind: str = "generation"  # generation | count_tokens (count calls are not recorded today)
    # The version of the weights that sampled this call (set by `POST /v1/admin/resume
    # {"policy_version": V}`; None until a version was ever set) and how long a weight-sync
    # pause held the call before it went upstream (not part of latency_ms).
    policy_version: int | None = None
    held_ms: float = 0.0
    tito_reason: str | None = None  # "continued", or why not (proxy_app/tito/matching.py)
    # Which weights sampled which completion tokens (CONTRACT "Agent lineage and versions per
    # token"): [[token_offset, version], ...] ordered by offset, first offset 0; one pair unless a
    # stream ran across a resume that changed the version (proxy_app/versions.py).
    policy_versions: list[list[Any]] = field(default_factory=list)

    def to_dict(self, text_ids: bool = False) -> dict[str, Any]:
        """Plain data; `text_ids` leaves a TokenIds as it is (the record codec stores its text)."""
        out = super().to_dict()
        if not text_ids:
            out["prompt_token_ids"] = plain(out["prompt_token_ids"])
        return out


@dataclass
class Trace(Record):
    """One trainable sequence: prompt ids then response ids with a loss mask."""

    prompt_ids: list[int]
    response_ids: list[int]
    loss_mask: list[int]
    response_logprobs: list[float] | None = None
    messages: list[dict[str, Any]] = field(default_factory=list)
    tools: list[dict[str, Any]] = field(default_factory=list)
    finish_reason: str | None = None
    reward: float | None = None
    call_ids: list[str] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)
    # [[offset into response_ids, version], ...]: which weights sampled the sampled tokens (the
    # spliced-in mask-0 tokens take the version of the call before them); merge/versions.py.
    policy_versions: list[list[Any]] = field(default_factory=list)


@dataclass
class Trajectory(Record):
    """All traces of one session plus how they were built and graded."""

    _nested: ClassVar[dict[str, type]] = {"traces": Trace}

    session_id: str
    task_id: str | None = None
    status: str = SessionState.COMPLETED  # one of TERMINAL_STATES
    builder: str = "per_request"
    traces: list[Trace] = field(default_factory=list)
    stats: dict[str, Any] = field(default_factory=dict)
    reward: float | None = None
    error: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass
class GatewaySession(Record):
    """A gateway session: the key a harness uses as its API key, bound to one session id."""

    session_id: str
    key: str
    task_id: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    created_at: float = field(default_factory=time.time)
    sampling: dict[str, Any] = field(default_factory=dict)  # the task's policy, enforced per call


@dataclass
class RuntimeHandle:
    """Where a session's harness runs, as the runtime that started it describes it.

    A runtime is re-attachable: `Runtime.start` returns this handle, the init stage stores it in
    the session record, and a run worker in another process (or a takeover after a worker died,
    or the janitor, recovery and leftovers) finds the same environment again from it. One type
    for every backend, so the fields a backend sets are named once; those it does not use stay
    None. Stored in Redis as the dict `to_dict` returns (absent fields left out, so a local
    handle stays the small dict it always was); `from_dict` reads every stored form, and keys it
    does not know survive a round trip in `extra`.
    """

    backend: str
    session_dir: str = ""
    workdir: str = ""  # where commands start, as the harness sees it (inside a container: its path)
    home: str = ""  # the harness's HOME
    env: dict[str, str] = field(default_factory=dict)  # the task's runtime.env
    # The node that started the runtime. A process group id, a sandbox directory or a container
    # name means something only on that host (hosts may even share a pid space), so stages check
    # `is_here` before they signal, reap or tear down a runtime, and route a session's run and
    # postrun to this node (tasks/routing.py). A handle from before host stamps has none and
    # belongs to the single machine it was made on, i.e. here.
    host: str | None = None
    host_workdir: str | None = None  # docker, apptainer: the work dir's path on the host
    cwd: str | None = None  # bwrap: runtime.workdir inside the sandbox (else workdir)
    allow_internet: bool | None = None  # bwrap: share the host network
    gpus: int | None = None  # bwrap: pass /dev through
    container: str | None = None  # docker: container name
    container_id: str | None = None
    network: str | None = None  # docker: network mode ("none": the gateway is bridged in)
    instance: str | None = None  # apptainer: instance name
    pgid: int | None = None  # the running command's process group (set when it starts)
    exec_id: str | None = None  # docker: the running command's exec id
    session_id: str | None = None  # whose runtime (else the session dir's name)
    # The gateway endpoints the running command may reach; set by the run stage for one exec, so
    # a sandbox without a network gets exactly these bridged in (runtimes/netbridge.py).
    gateway_urls: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)  # stored keys this version does not know

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name == "extra" or value is None or (f.name == "gateway_urls" and not value):
                continue
            out[f.name] = value
        return {**self.extra, **out}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RuntimeHandle:
        names = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        known = {k: v for k, v in data.items() if k in names}
        known.setdefault("backend", "")
        extra = {k: v for k, v in data.items() if k not in names}
        return cls(**known, extra=extra)

    @classmethod
    def stored(cls, data: RuntimeHandle | dict[str, Any] | None) -> RuntimeHandle | None:
        """The handle of a stored record field (`{}` and None: no runtime)."""
        if data is None or isinstance(data, RuntimeHandle):
            return data
        return cls.from_dict(data) if data else None

    def updated(self, **fields: Any) -> RuntimeHandle:
        """A copy with `fields` set (e.g. what `Runtime.exec`'s on_start reports: pgid, exec_id)."""
        return dataclasses.replace(self, **fields)

    def stamped(self, node: str) -> RuntimeHandle:
        """This handle held by `node` (the worker that started it)."""
        return self.updated(host=node)

    def is_here(self, node: str) -> bool:
        """True when `node` may signal or tear down this runtime (see `host`)."""
        return self.host is None or self.host == node


@dataclass
class SessionRecord(Record):
    """A rollout session (one sample of a task) as the pipeline tracks it in Redis."""

    session_id: str
    task_id: str
    index: int = 0
    state: str = SessionState.REGISTERED
    attempt: int = 0  # bumped whenever a stage is taken over after a worker died
    created_at: float = field(default_factory=time.time)
    updated_at: float = field(default_factory=time.time)
    deadline: float | None = None  # unix time; the budget starts when INIT starts
    timings: dict[str, float] = field(default_factory=dict)  # "<stage>_start"/"<stage>_end"
    node: str | None = None  # host:pid of the worker that last moved it
    error: str | None = None
    gateway_session_id: str | None = None
    gateway_key: str | None = None
    base_urls: dict[str, str] = field(default_factory=dict)
    workdir: str | None = None
    runtime: RuntimeHandle | None = None  # where the harness runs (None: not started)
    exit_code: int | None = None
    outcome: str | None = None  # one of TERMINAL_STATES, decided by the run stage
    reward: float | None = None
    stats: dict[str, Any] = field(default_factory=dict)
    history: list[list[Any]] = field(default_factory=list)  # [state, unix time, node]
    # What happened to the session besides its state moves, e.g. {"event": "orphans_reaped", "at":
    # unix time, "node": ..., "pids": [...]} when a worker reaped what a dead worker left running
    # for it (runtimes/orphans.py). Appended in its own WATCH/MULTI; stages never rewrite it.
    events: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.runtime = RuntimeHandle.stored(self.runtime)  # a stored dict (from_dict, old callers)

    def to_dict(self) -> dict[str, Any]:
        out = super().to_dict()
        out["runtime"] = self.runtime.to_dict() if self.runtime is not None else {}
        return out

    @property
    def runtime_host(self) -> str | None:
        """The node holding the session's runtime (None: unstamped or not started)."""
        return self.runtime.host if self.runtime is not None else None

    def runtime_is_here(self, node: str) -> bool:
        """True when `node` may signal or tear down the session's runtime (no runtime: nothing
        elsewhere to defer to)."""
        return self.runtime is None or self.runtime.is_here(node)


@dataclass
class GroupSession(Record):
    """One session of a group as the trainer sees it."""

    session_id: str
    state: str
    reward: float | None = None
    error: str | None = None


@dataclass
class Group(Record):
    """A finished task handed to a trainer: its `num_samples` sessions and their trajectories
    (`GET /v1/groups/next`). `delivery` counts the hand-outs (>1: redelivered after a lease ran
    out). `stale` and `advantages` are filled in client-side (polar_mq.groups)."""

    _nested: ClassVar[dict[str, type]] = {"sessions": GroupSession, "trajectories": Trajectory}

    task_id: str
    metadata: dict[str, Any] = field(default_factory=dict)
    policy_version: int | None = None
    delivery: int = 1
    sessions: list[GroupSession] = field(default_factory=list)
    trajectories: list[Trajectory] = field(default_factory=list)
    finished_at: float | None = None
    lease_expires_at: float | None = None
    stale: bool = False
    advantages: list[float | None] | None = None  # aligned with `trajectories`

    @property
    def rewards(self) -> list[float | None]:
        return [t.reward if t.status != SessionState.ERROR else None for t in self.trajectories]
