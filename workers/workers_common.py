"""Shared start-up of the stage pools: settings from the environment, then `polar-mq worker`."""

from __future__ import annotations

import os

from polar_mq.cli import main


def run_stage(stage: str, default_concurrency: int) -> int:
    concurrency = os.environ.get(f"POLAR_{stage.upper()}_CONCURRENCY") or str(default_concurrency)
    argv = ["worker", "--stage", stage, "--concurrency", concurrency,
            "--loglevel", os.environ.get("POLAR_LOG_LEVEL", "INFO")]
    if os.environ.get("POLAR_CELERY_POOL"):
        argv += ["--pool", os.environ["POLAR_CELERY_POOL"]]
    return main(argv)
