"""Configuration objects, read once from env / CLI flags and passed down.

Nothing else in the package reads `os.environ` for configuration.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field
from pathlib import Path


def _env_float(name: str, default: float) -> float:
    value = os.environ.get(name)
    return float(value) if value else default


def _env_on(name: str) -> bool:
    """A switch that is on unless set to 0, false or no."""
    return os.environ.get(name, "1").lower() not in ("0", "false", "no")


def polar_home() -> Path:
    """Where polar_mq keeps its per-user state (the token file): $POLAR_HOME, else
    ~/.config/polar_mq."""
    return Path(os.environ.get("POLAR_HOME") or Path.home() / ".config" / "polar_mq")


@dataclass(frozen=True)
class TokenSettings:
    """Where the service tokens come from: POLAR_API_TOKEN, POLAR_GATEWAY_TOKEN, the token file.

    Resolution (polar_mq.auth): a service's own variable, else the other one, else the file
    ($POLAR_HOME/token, mode 0600, generated on the first start of a service)."""

    api_token: str | None = None
    gateway_token: str | None = None
    token_file: Path = field(default_factory=lambda: polar_home() / "token")

    @classmethod
    def from_env(cls) -> "TokenSettings":
        env = os.environ
        return cls(api_token=env.get("POLAR_API_TOKEN") or None,
                   gateway_token=env.get("POLAR_GATEWAY_TOKEN") or None,
                   token_file=polar_home() / "token")

    def existing(self, role: str) -> str | None:
        """The token a service (`role` "api" or "gateway") requires, without creating one: its own
        variable, the other one, then the token file's content (None when there is none)."""
        own, other = (self.api_token, self.gateway_token) if role == "api" else (self.gateway_token, self.api_token)
        if own or other:
            return own or other
        try:
            return self.token_file.read_text(encoding="utf-8").strip() or None
        except OSError:
            return None


@dataclass(frozen=True)
class LogSettings:
    """Size cap of the log files polar_mq writes (polar_mq/runtimes/logcap.py): harness and prepare logs
    of every runtime and the process logs of `polar-mq up`. A log past `max_bytes` is rotated to
    `<name>.1` …; `backups` old files are kept, so one log takes at most (backups + 1) × max_bytes.
    POLAR_LOG_MAX_BYTES (default 64 MiB; 0: no cap), POLAR_LOG_BACKUPS (default 2)."""

    max_bytes: int = 64 * 1024 * 1024
    backups: int = 2

    @classmethod
    def from_env(cls) -> "LogSettings":
        env = os.environ
        return cls(max_bytes=int(env.get("POLAR_LOG_MAX_BYTES") or cls.max_bytes),
                   backups=int(env.get("POLAR_LOG_BACKUPS") or cls.backups))


@dataclass(frozen=True)
class DockerSettings:
    """The docker runtime's knobs (polar_mq/runtimes/docker.py), read here like every other setting.

    POLAR_DOCKER_MOUNTS (extra `host:container[:ro]` binds, comma-separated), POLAR_DOCKER_PIDS_LIMIT
    (default 4096), POLAR_DOCKER_ORPHAN_AGE (s an unknown container must reach before the sweep
    removes it: it may be another deployment's; default 3600), POLAR_DOCKER_SWEEP_INTERVAL (s between
    janitor sweeps; 0 disables; default 30), DOCKER_HOST (the engine; the SDK reads it too)."""

    mounts: str | None = None
    pids_limit: int = 4096
    orphan_age: float = 3600.0
    sweep_interval: float = 30.0
    docker_host: str | None = None

    @classmethod
    def from_env(cls) -> "DockerSettings":
        env = os.environ
        return cls(mounts=env.get("POLAR_DOCKER_MOUNTS") or None,
                   pids_limit=int(env.get("POLAR_DOCKER_PIDS_LIMIT") or cls.pids_limit),
                   orphan_age=_env_float("POLAR_DOCKER_ORPHAN_AGE", cls.orphan_age),
                   sweep_interval=_env_float("POLAR_DOCKER_SWEEP_INTERVAL", cls.sweep_interval),
                   docker_host=env.get("DOCKER_HOST") or None)

    def engine_configured(self) -> bool:
        """A docker engine to talk to: DOCKER_HOST set, or the default socket present."""
        return bool(self.docker_host) or os.path.exists("/var/run/docker.sock")


@dataclass
class GatewaySettings:
    upstreams: list[str] = field(default_factory=list)
    redis_url: str | None = None
    host: str = "127.0.0.1"
    port: int = 8600
    served_model: str | None = None
    public_url: str | None = None  # base of the URLs handed to harnesses; default http://host:port
    admin_token: str | None = None  # when set, /sessions endpoints need Authorization: Bearer
    max_body_bytes: int = 32 * 1024 * 1024
    upstream_timeout: float = 600.0  # seconds for one upstream generation
    connect_timeout: float = 5.0
    retries: int = 3  # extra attempts on connection errors and 5xx
    retry_backoff: float = 0.25  # seconds, doubled per attempt
    health_interval: float = 15.0
    first_byte_wait: float = 2.0  # streaming: wait this long for the upstream before sending headers
    ping_interval: float = 5.0  # streaming keep-alive while the upstream works
    spool_dir: str | None = None  # where records go when Redis is down (never lost silently)
    check_token_ids: bool = True
    pause_max_hold: float = 900.0  # a weight-sync pause never holds a generation longer than this
    alive_ttl: float = 5.0  # a process silent this long is dead: its calls end as gateway_lost
    stream_passthrough: bool = True  # stream from the upstream; False: synthesise from one call
    tito: str = "auto"  # token-in continuation: auto | on | off (proxy_app/tito)
    tokenizer: str | None = None  # the served model's tokenizer directory (needed for tito)
    # gunicorn worker model: gevent (one greenlet per connection: thousands of open streams per
    # process, keep-alive handled inline) or gthread (one thread per request, `threads` of them).
    worker_class: str = "gevent"
    worker_connections: int = 4096  # gevent: connections one worker process holds at once
    # gevent: serve plain provider calls on the lean path (proxy_app/lean_worker.py), the rest
    # through gunicorn's own HTTP handling; False: every request through gunicorn.
    lean_http: bool = True

    @classmethod
    def from_env(cls, **overrides) -> "GatewaySettings":
        env = os.environ
        s = cls(
            upstreams=[u for u in env.get("POLAR_UPSTREAMS", "").split(",") if u],
            redis_url=env.get("POLAR_REDIS_URL") or None,
            served_model=env.get("POLAR_SERVED_MODEL") or None,
            public_url=env.get("POLAR_GATEWAY_PUBLIC_URL") or None,
            admin_token=env.get("POLAR_GATEWAY_TOKEN") or None,
            upstream_timeout=_env_float("POLAR_UPSTREAM_TIMEOUT", 600.0),
            first_byte_wait=_env_float("POLAR_FIRST_BYTE_WAIT", 2.0),
            ping_interval=_env_float("POLAR_PING_INTERVAL", 5.0),
            spool_dir=env.get("POLAR_SPOOL_DIR") or None,
            max_body_bytes=int(env.get("POLAR_MAX_BODY_BYTES") or 32 * 1024 * 1024),
            stream_passthrough=_env_on("POLAR_STREAM_PASSTHROUGH"),
            tito=env.get("POLAR_TITO") or "auto",
            tokenizer=env.get("POLAR_TOKENIZER") or None,
            worker_class=env.get("POLAR_GATEWAY_WORKER") or "gevent",
            worker_connections=int(env.get("POLAR_GATEWAY_CONNECTIONS") or 4096),
            lean_http=_env_on("POLAR_GATEWAY_LEAN_HTTP"),
            alive_ttl=_env_float("POLAR_GATEWAY_ALIVE_TTL", 5.0),
        )
        for k, v in overrides.items():
            if v is not None:
                setattr(s, k, v)
        return s

    @property
    def base_url(self) -> str:
        return (self.public_url or f"http://{self.host}:{self.port}").rstrip("/")


@dataclass
class PipelineSettings:
    """Settings shared by the rollout API and the stage workers."""

    redis_url: str = "redis://127.0.0.1:6379/0"
    gateway_url: str = "http://127.0.0.1:8600"
    gateway_token: str | None = None  # the gateway's admin token, if it has one
    # The gateway's Redis when it is not the pipeline's (POLAR_GATEWAY_REDIS_URL): retention
    # expires the gateway sessions' records there. None: one Redis holds both.
    gateway_redis_url: str | None = None
    api_token: str | None = None  # rollout API bearer token (POLAR_API_TOKEN)
    ready_capacity: int = 8  # READY buffer: sessions prepared but not yet running
    # A stage worker's lease, renewed every lease_ttl / 6; its holder self-fences after 0.6 ×
    # lease_ttl without a renewal. 8 s: a dead host's sessions move on within host_loss_seconds
    # (tasks/worker/host_loss.py bound; tests/pipeline/test_host_loss.py).
    lease_ttl: float = 8.0
    visibility_timeout: float = 6 * 3600.0  # broker redelivery; leases + the janitor recover sooner
    janitor_interval: float = 5.0
    # A host whose beat stops: its sessions move on within this many seconds (tasks/host_loss.py).
    host_loss_seconds: float = 10.0
    max_attempts: int = 3  # janitor takeovers per session before it is given up as ERROR
    sessions_dir: str = os.path.join(os.path.expanduser("~"), ".cache", "polar_mq", "sessions")
    results_dir: str = os.path.join(os.path.expanduser("~"), ".cache", "polar_mq", "results")
    callback_retries: int = 8
    callback_backoff: float = 1.0  # seconds, doubled per attempt (capped at 60)
    pause_wait: float = 60.0  # admin pause: how long to wait for in-flight generations
    gateway_heartbeat_ttl: float = 10.0  # a gateway silent this long is dead: its calls do not block a pause
    postrun_wait: float = 30.0  # postrun waits this long for the session's calls still in flight
    keep_workdirs: bool = False  # keep each session's work dir and HOME after postrun (logs stay)
    retention_seconds: float = 7 * 24 * 3600.0  # a finished task's Redis data lives this long after export/ack
    # The janitor collects unexported finished tasks and orphan gateway sessions this often (0: never).
    retention_sweep_interval: float = 300.0
    orphan_scan_interval: float = 60.0  # workers look for runtimes a dead worker left (at start, then this often; 0: start only)
    # This host's name in the cluster (POLAR_NODE, default the hostname): runtimes are stamped with
    # it and a session's run/postrun go to the per-node queues `run@NODE` / `postrun@NODE`.
    node: str = field(default_factory=socket.gethostname)
    # The local runtime has no isolation: it runs prepare.exec steps of submitted (untrusted)
    # tasks only when the worker is started with POLAR_ALLOW_LOCAL_EXEC=1.
    allow_local_exec: bool = False
    # Signs callbacks (X-Polar-Signature): POLAR_CALLBACK_SECRET, else $POLAR_HOME/callback.secret
    # (callback_guard.callback_secret), never a service token.
    callback_token: str | None = None
    # Celery task events (task-sent/received/started/succeeded) are for Flower only; each costs a
    # publish per task and stage. `polar-mq up` turns them off when it starts no Flower.
    task_events: bool = True
    # Celery's two INFO lines per task ("Received task", "Task ... succeeded"): six per session,
    # a visible share of a no-op session's CPU (bench/bench_dispatch.py). The session record keeps every

    # stage move with node and time (`polar-mq status`); warnings and errors are logged anyway.
    task_log: bool = False

    @classmethod
    def from_env(cls, **overrides) -> "PipelineSettings":
        env = os.environ
        s = cls()
        s.redis_url = env.get("POLAR_REDIS_URL") or s.redis_url
        s.gateway_url = env.get("POLAR_GATEWAY_URL") or s.gateway_url
        s.gateway_redis_url = env.get("POLAR_GATEWAY_REDIS_URL") or None
        tokens = TokenSettings.from_env()  # the env variables, else the token file
        s.gateway_token = tokens.existing("gateway")
        s.api_token = tokens.existing("api")
        s.ready_capacity = int(env.get("POLAR_READY_CAPACITY") or s.ready_capacity)
        s.lease_ttl = _env_float("POLAR_LEASE_TTL", s.lease_ttl)
        s.visibility_timeout = _env_float("POLAR_VISIBILITY_TIMEOUT", s.visibility_timeout)
        s.janitor_interval = _env_float("POLAR_JANITOR_INTERVAL", s.janitor_interval)
        s.host_loss_seconds = _env_float("POLAR_HOST_LOSS_SECONDS", s.host_loss_seconds)
        s.max_attempts = int(env.get("POLAR_MAX_ATTEMPTS") or s.max_attempts)
        s.sessions_dir = env.get("POLAR_SESSIONS_DIR") or s.sessions_dir
        s.results_dir = env.get("POLAR_RESULTS_DIR") or s.results_dir
        s.callback_retries = int(env.get("POLAR_CALLBACK_RETRIES") or s.callback_retries)
        s.callback_backoff = _env_float("POLAR_CALLBACK_BACKOFF", s.callback_backoff)
        s.gateway_heartbeat_ttl = _env_float("POLAR_GATEWAY_HEARTBEAT_TTL", s.gateway_heartbeat_ttl)
        s.postrun_wait = _env_float("POLAR_POSTRUN_WAIT", s.postrun_wait)
        s.keep_workdirs = env.get("POLAR_KEEP_WORKDIRS", "0").lower() in ("1", "true", "yes")
        s.retention_seconds = _env_float("POLAR_RETENTION_SECONDS", s.retention_seconds)
        s.retention_sweep_interval = _env_float("POLAR_RETENTION_SWEEP_SECONDS", s.retention_sweep_interval)
        s.orphan_scan_interval = _env_float("POLAR_ORPHAN_SCAN_INTERVAL", s.orphan_scan_interval)
        s.node = env.get("POLAR_NODE") or s.node
        s.allow_local_exec = env.get("POLAR_ALLOW_LOCAL_EXEC", "").lower() in ("1", "true", "yes")
        s.callback_token = env.get("POLAR_CALLBACK_SECRET") or None
        s.task_events = _env_on("POLAR_TASK_EVENTS")
        s.task_log = env.get("POLAR_TASK_LOG", "0").lower() in ("1", "true", "yes")
        for k, v in overrides.items():
            if v is not None:
                setattr(s, k, v)
        return s
