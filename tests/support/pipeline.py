"""Test support for the rollout pipeline: real Celery worker pools as separate processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from polar_mq import states
from polar_mq.store.pipeline import PipelineStore
from polar_mq.store.core import connect
from polar_mq.taskspec import parse_task
from polar_mq.tasks.app.celery import make_celery
from polar_mq.tasks.app.routing import INIT_TASK
from polar_mq.settings import PipelineSettings

ROOT = Path(__file__).resolve().parents[2]
TINY_AGENT = ROOT / "examples" / "tiny_agent.py"


@dataclass
class Pipeline:
    redis_url: str
    gateway_url: str
    env: dict[str, str]
    log_dir: Path
    workers: dict[str, list[subprocess.Popen]] = field(default_factory=dict)
    redis_server: Any = None

    @property
    def store(self) -> PipelineStore:
        return PipelineStore(connect(self.redis_url))

    def start_worker(self, stage: str, concurrency: int = 1) -> subprocess.Popen:
        log = open(self.log_dir / f"worker-{stage}-{len(self.workers.get(stage, []))}.log", "ab")
        proc = subprocess.Popen([sys.executable, "-m", "polar_mq.cli", "worker", "--stage", stage,
                                 "--concurrency", str(concurrency), "--loglevel", "INFO"],
                                stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                                env={**os.environ, **self.env}, start_new_session=True)
        self.workers.setdefault(stage, []).append(proc)
        return proc

    def kill_worker(self, proc: subprocess.Popen) -> None:
        """kill -9 of the whole worker (main process and its pool children): a machine dying."""
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()

    def stop(self) -> None:
        for procs in self.workers.values():
            for proc in procs:
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGTERM)
        for procs in self.workers.values():
            for proc in procs:
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
        if self.redis_server is not None:
            self.redis_server.stop()

    def submit(self, body: dict[str, Any]) -> tuple[str, list[str]]:
        """Store a task and enqueue its sessions (what the API does), without the API."""
        task = parse_task(body)
        sids, created = self.store.create_task(task)
        if created:
            app = make_celery(PipelineSettings(redis_url=self.redis_url))
            for sid in sids:
                app.send_task(INIT_TASK, args=[sid], queue="init")
        return task.task_id, sids

    def wait(self, sids: list[str], timeout: float = 60.0) -> list[Any]:
        deadline = time.time() + timeout
        while time.time() < deadline:
            recs = self.store.get_sessions(sids)
            if len(recs) == len(sids) and all(states.is_terminal(r.state) for r in recs):
                return recs
            time.sleep(0.2)
        recs = self.store.get_sessions(sids)
        raise AssertionError(f"sessions not finished: {[(r.session_id, r.state) for r in recs]}")


class BorrowedRedis:
    """A Redis the test owns, handed to make_pipeline(redis_server=...): the pipeline's stop()
    leaves it running for the test's other users."""

    def __init__(self, url: str):
        self.url = url

    def stop(self) -> None:
        pass


def make_pipeline(gateway, base: Path, *, redis_server=None, **env: str) -> Pipeline:
    """A pipeline with its own Redis (so its queues are its own) talking to the shared gateway."""
    from polar_mq.cli.embedded_redis import start_embedded

    server = redis_server or start_embedded()
    settings = {"POLAR_REDIS_URL": server.url, "POLAR_GATEWAY_URL": gateway.url,
                "POLAR_SESSIONS_DIR": str(base / "sessions"), "POLAR_RESULTS_DIR": str(base / "results"),
                "POLAR_LEASE_TTL": "3", "POLAR_JANITOR_INTERVAL": "1", "POLAR_READY_CAPACITY": "2",
                "POLAR_CALLBACK_BACKOFF": "0.2",
                # As `polar-mq up` without Flower: stage hand-offs use tasks/publish.py (a test that
                # needs Celery's task events, or its send_task path, passes POLAR_TASK_EVENTS="1").
                "POLAR_TASK_EVENTS": "0",
                # Tests look into finished sessions' work dirs; test_longrun_cleanup checks removal.
                "POLAR_KEEP_WORKDIRS": "1", **env}
    p = Pipeline(redis_url=server.url, gateway_url=gateway.url, env=settings, log_dir=base)
    p.redis_server = server
    return p


def agent_task(**overrides: Any) -> dict[str, Any]:
    body = {"instruction": "Write hello into polar.txt", "num_samples": 3, "timeout_seconds": 60,
            "agent": {"harness": "shell", "model": "policy",
                      "options": {"command": [sys.executable, str(TINY_AGENT)]}},
            "runtime": {"backend": "local"}, "builder": {"strategy": "prefix_merging"}}
    body.update(overrides)
    return body


def running_pipeline(gateway, tmp_path_factory, name: str, *, init: int = 2, run: int = 2, postrun: int = 1,
                     **env: str) -> Iterator[Pipeline]:
    """A test module's pipeline with its three pools started, stopped when the module is done: a
    module fixture `yield from`s it."""
    p = make_pipeline(gateway, tmp_path_factory.mktemp(name), **env)
    p.start_worker("init", init)
    p.start_worker("run", run)
    p.start_worker("postrun", postrun)
    try:
        yield p
    finally:
        p.stop()
