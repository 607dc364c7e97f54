"""What several commands share: the stage pool defaults, the token a started service requires,
and Redis URL checks. Commands import it; it imports no command (no cycle between `commands`,
`up`, `demo`: tests/pipeline/test_layout.py)."""

from __future__ import annotations

import sys
from typing import Mapping

# prefork's pool size of each stage (a process per slot); the default threads pool is sized from
# the host instead (polar_mq/cli/slots.py: `polar-mq up`, `polar-mq worker`, workers/<stage>.py).
STAGE_CONCURRENCY = {"init": 2, "run": 4, "postrun": 2}
STAGES = tuple(STAGE_CONCURRENCY)  # = tasks.routing.QUEUES (tests/pipeline/test_shape.py), without importing it here


def worker_defaults(stage: str, env: Mapping[str, str]) -> dict[str, str | int | None]:
    """What `polar-mq worker --stage STAGE` uses for the options it is not given: the Celery pool
    from ``POLAR_<STAGE>_POOL`` / ``POLAR_CELERY_POOL`` (else threads), the pool size from
    ``POLAR_<STAGE>_CONCURRENCY`` (else sized from the host for that pool: slots.py), the log
    level from ``POLAR_LOG_LEVEL`` (INFO)."""
    from polar_mq.cli import slots

    pool, concurrency, _ = slots.sizing(stage, env)
    return {"concurrency": concurrency, "loglevel": env.get("POLAR_LOG_LEVEL") or "INFO", "pool": pool}


def redis_credentials_ok(url: str, role: str | None = None) -> bool:
    """False (and the reason on stderr) when `url`'s Redis wants credentials the URL lacks, or its
    ACL user may not touch `role`'s keys (hub, worker, gateway: store/redis_acl.py)."""
    from polar_mq.cli.embedded_redis import credentials_problem

    problem = credentials_problem(url, role=role)
    if problem:
        print(f"error: {problem}", file=sys.stderr, flush=True)
    return problem is None


def redact_url(url: str) -> str:
    """`url` with its password replaced by ***, for log lines."""
    head, at, tail = url.rpartition("@")
    if not at:
        return url
    scheme, sep, cred = head.partition("://")
    user = cred.partition(":")[0]
    return f"{scheme}{sep}{user}:***@{tail}"


def service_token(role: str, *, dev: bool, explicit: str | None = None) -> str | None:
    """The token a service started from the command line requires. Without --dev it never serves
    open: a missing token is generated into $POLAR_HOME/token. With --dev a token is used only
    when one is set (flag or environment), else the service is open and says so loudly."""
    from polar_mq import auth as tokens
    from polar_mq.settings import TokenSettings

    if explicit:
        return explicit
    settings = TokenSettings.from_env()
    if dev:
        token = tokens.server_token(role, settings, create=False) if (settings.api_token or
                                                                      settings.gateway_token) else None
        if token is None:
            tokens.warn_open(role)
        return token
    existed = tokens.read_file(settings.token_file) is not None
    token = tokens.server_token(role, settings)
    if not (settings.api_token or settings.gateway_token) and not existed:
        print(f"polar_mq {role}: generated a token in {settings.token_file} (mode 0600); "
              f"polar-mq commands and polar_mq.client.Client read it from there", file=sys.stderr, flush=True)
    return token


def viewer_link(api_url: str, token: str | None) -> str:
    """The viewer's address that signs a browser in (api/ui/auth.py: the token becomes a cookie
    and leaves the address bar at once)."""
    from urllib.parse import quote

    return f"{api_url}/ui/?token={quote(token, safe='')}" if token else f"{api_url}/ui/"
