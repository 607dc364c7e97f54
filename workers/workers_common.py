"""Shared start-up of the stage pools: `polar-mq worker --stage STAGE` with the CLI's own defaults.

Settings come from the environment (polar_mq/settings.py); the pool size, log level and Celery
pool are the CLI's defaults for a worker (`polar_mq.cli.commands.worker_defaults`: POLAR_<STAGE>_CONCURRENCY,
POLAR_LOG_LEVEL, POLAR_CELERY_POOL), so an entry point here and `polar-mq worker` start the same pool.
"""

from __future__ import annotations

from polar_mq.cli.commands import main


def run_stage(stage: str) -> int:
    return main(["worker", "--stage", stage])
