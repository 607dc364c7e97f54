"""A rollout stack for the trainer-mapping tests: real Redis, the stand-in model, the gateway,
real Celery pools and the API; groups of the tiny openai-SDK agent (a write-file tool call, the
tool result, a final answer) built with prefix_merging."""

from __future__ import annotations

import pytest

from tests.support.servers import stop
from tests.support.pipeline import agent_task, make_pipeline
from polar_mq.client import Client
from tests.api.test_api import start_api


@pytest.fixture(scope="module")
def rollout_stack(gateway, tmp_path_factory, log_dir):
    p = make_pipeline(gateway, tmp_path_factory.mktemp("trainers"))
    p.start_worker("init", 2)
    p.start_worker("run", 2)
    p.start_worker("postrun", 1)
    api = start_api(log_dir, p.redis_url, name="api-trainers")
    yield p, Client(api.url, token="")
    stop(api.proc)
    p.stop()


def drain(client: Client) -> None:
    while True:
        groups = client.next_groups(limit=100, wait=0, lease=60)
        if not groups:
            return
        for g in groups:
            client.ack_group(g["task_id"], reason="skipped")


def real_group(client: Client, task_id: str, samples: int = 3, policy_version: int = 3) -> dict:
    """One finished group of real agent sessions (acked)."""
    client.submit(agent_task(task_id=task_id, num_samples=samples, metadata={"policy_version": policy_version}))
    for _ in range(30):
        for g in client.next_groups(limit=10, wait=10, lease=120, msgpack_body=False):
            client.ack_group(g["task_id"], reason="trained")
            if g["task_id"] == task_id:
                return g
    raise AssertionError(f"group {task_id} never finished")
