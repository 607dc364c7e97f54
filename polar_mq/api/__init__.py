"""The rollout API (Flask): submit TaskRequests, follow sessions, fetch trajectories, pause the gateway.

Modules: `app` (factory, error handlers), `routes` (tasks and sessions), `admin` (gateway pause),
`ops` (health, metrics, openapi), `views` (JSON shapes), `problems` (RFC 9457), `auth` (bearer),
`serve` (gunicorn / dev server).
"""

from polar_mq.api.app import create_app

__all__ = ["create_app"]
