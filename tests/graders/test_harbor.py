"""Harbor tasks end to end in docker: `polar-mq submit --dataset DIR` over a directory of Harbor
task dirs made here (their Dockerfiles FROM the locally imported test image), each environment
built with the test's private Docker engine, the agent (the tiny agent through the gateway) run in
that image, and grader `harbor` running the task's tests/test.sh in a fresh container whose reward
file is the reward. A task whose FROM image is not present is a clear error naming it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.servers import stop
from tests.support.docker_engine import running_engine
from tests.support.pipeline import ROOT, TINY_AGENT, running_pipeline
from polar_mq import states
from polar_mq.rl.datasets import harbor
from polar_mq.graders.harbor import parse_reward
from tests.api.test_api import start_api

TEST_SH = """#!/bin/bash
# The agent wrote polar.txt in its work dir (the image's WORKDIR), next to the seed the image has.
if [ "$(cat /app/polar.txt)" = "hello from polar" ] && [ -f /app/seed.txt ] && [ "$HARBOR_CHECK" = on ]; then
  {ok}
else
  {bad}
fi
"""


def make_task(root: Path, name: str, *, base: str, ok: str, bad: str) -> Path:
    d = root / name
    (d / "environment").mkdir(parents=True)
    (d / "tests").mkdir()
    (d / "solution").mkdir()
    (d / "task.toml").write_text(
        'version = "1.0"\n\n[metadata]\ndifficulty = "easy"\ncategory = "files"\n\n'
        '[verifier]\ntimeout_sec = 60.0\n[verifier.env]\nHARBOR_CHECK = "on"\n\n'
        '[agent]\ntimeout_sec = 120.0\n\n[environment]\nbuild_timeout_sec = 120.0\ncpus = 1\nmemory_mb = 1024\n')
    (d / "instruction.md").write_text("Write hello into polar.txt\n")
    (d / "environment" / "seed.txt").write_text("seed\n")
    (d / "environment" / "Dockerfile").write_text(f"FROM {base}\nWORKDIR /app\nCOPY seed.txt /app/seed.txt\n")
    (d / "tests" / "test.sh").write_text(TEST_SH.format(ok=ok, bad=bad))
    (d / "solution" / "solve.sh").write_text("echo hello from polar > /app/polar.txt\n")
    return d


@pytest.fixture(scope="module")
def engine():
    yield from running_engine()


@pytest.fixture(scope="module")
def pipeline(engine, gateway, tmp_path_factory):
    yield from running_pipeline(gateway, tmp_path_factory, "harbor", init=1, run=2, postrun=2, **engine.env())


@pytest.fixture(scope="module")
def api(pipeline, log_dir):
    server = start_api(log_dir, pipeline.redis_url, name="api-harbor")
    yield server
    stop(server.proc)


def test_harbor_directory_submitted_built_run_and_graded_in_docker(engine, pipeline, api, tmp_path):
    tasks = tmp_path / "tasks"
    make_task(tasks, "txt-reward", base=engine.image, ok="echo 1 > /logs/verifier/reward.txt",
              bad="echo 0 > /logs/verifier/reward.txt")
    make_task(tasks, "json-reward", base=engine.image,
              ok="""echo '{"correct": 1, "style": 0.5}' > /logs/verifier/reward.json""",
              bad="""echo '{"correct": 0, "style": 0}' > /logs/verifier/reward.json""")
    make_task(tasks, "missing-base", base="polar-not-here:1.0", ok="true", bad="true")
    template = tmp_path / "agent.yaml"
    template.write_text(json.dumps({"num_samples": 2, "agent": {
        "harness": "shell", "options": {"command": f"{sys.executable} {TINY_AGENT}"}}}))
    env = {**os.environ, **engine.env(), "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-m", "polar_mq.cli", "submit", "--dataset", str(tasks),
                          "--template", str(template), "--api", api.url, "--token", ""],
                         capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert out.returncode == 1, (out.stdout, out.stderr)  # one task could not be built
    assert "polar-not-here:1.0" in out.stderr and "not present" in out.stderr, out.stderr
    task_ids = out.stdout.split()
    assert task_ids == ["harbor-json-reward", "harbor-txt-reward"], out.stdout

    store = pipeline.store
    sids = [sid for t in task_ids for sid in store.session_ids(t)]
    recs = pipeline.wait(sids, timeout=240)
    assert all(r.state == states.COMPLETED for r in recs), [(r.state, r.error) for r in recs]
    for rec in recs:
        traj = store.get_trajectory(rec.session_id)
        grade = traj.metadata["grade"]
        assert grade["metadata"]["grader"] == "harbor" and grade["status"] == "ok", grade
        assert traj.stats["calls"] >= 1  # the agent reached the gateway from inside its container
        if rec.task_id == "harbor-txt-reward":
            assert traj.reward == 1.0 and grade["details"]["rewards"] == {"reward": 1.0}
        else:
            assert traj.reward == 0.75 and grade["details"]["rewards"] == {"correct": 1.0, "style": 0.5}
        assert grade["details"]["image"] != ""  # the snapshot the fresh container ran from
    spec = store.task_request("harbor-txt-reward")
    assert spec.runtime.backend == "docker" and spec.runtime.image.startswith("polar-harbor/txt-reward:")
    assert spec.runtime.workdir == "/app" and spec.runtime.cpus == 1.0 and spec.runtime.memory_mb == 1024
    assert spec.timeout_seconds == 120.0 and spec.grader.config["timeout_seconds"] == 60.0
    assert spec.metadata["harbor"]["difficulty"] == "easy"
    assert engine.containers() == []  # session and grading containers removed
    images = [t for i in engine.client().images.list() for t in i.tags]
    assert not [t for t in images if t.startswith("polar-harbor-grade")], images  # snapshots removed


def test_agent_that_did_nothing_gets_reward_zero_and_no_reward_file_is_an_error(engine, pipeline, api, tmp_path):
    tasks = tmp_path / "t2"
    make_task(tasks, "lazy", base=engine.image, ok="echo 1 > /logs/verifier/reward.txt",
              bad="echo 0 > /logs/verifier/reward.txt")
    make_task(tasks, "broken-verifier", base=engine.image, ok="exit 3", bad="exit 3")
    rows = harbor.load_rows(tasks, client=engine.client())
    from polar_mq.client import Client

    client = Client(api.url, token="")
    sids = []
    for row in rows:
        body = {**row.data, "agent": {"harness": "shell", "options": {"command": "true"}}}
        sids += client.submit(body)["session_ids"]
    recs = {r.task_id: r for r in pipeline.wait(sids, timeout=180)}
    lazy = pipeline.store.get_trajectory(recs["harbor-lazy"].session_id)
    assert recs["harbor-lazy"].state == states.COMPLETED and lazy.reward == 0.0
    broken = recs["harbor-broken-verifier"]
    assert broken.state == states.ERROR and broken.reward is None, (broken.state, broken.reward)
    assert "no reward" in broken.error


def test_reward_files_and_dockerfile_bases(tmp_path):
    (tmp_path / "reward.json").write_text('{"a": 1, "b": 0}')
    assert parse_reward(tmp_path) == (0.5, {"a": 1.0, "b": 0.0})
    (tmp_path / "reward.txt").write_text("0.25\n")
    assert parse_reward(tmp_path) == (0.25, {"reward": 0.25})  # reward.txt first, as Harbor reads it
    with pytest.raises(ValueError):
        parse_reward(tmp_path / "none")
    assert harbor.base_images("FROM a:1 AS build\nRUN x\nFROM build\nFROM --platform=linux/amd64 b\n"
                              "FROM scratch\n") == ["a:1", "b"]
