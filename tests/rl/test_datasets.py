"""Datasets → tasks: the loader on every local format, SWE-bench / SWE-Gym rows and generic rows,
per-row errors, stable ids; then `polar-mq submit --dataset` against the real API and worker
pools, with a SWE-Gym-shaped row on a real small repository graded through the swebench extra."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.support.servers import ROOT, stop
from tests.support.grading import FAIL_TO_PASS, PASS_TO_PASS, make_repo
from tests.support.pipeline import running_pipeline
from polar_mq.client import Client
from polar_mq.rl.datasets import TaskOptions
from polar_mq.rl.datasets import build_tasks
from polar_mq.rl.datasets import image_name
from polar_mq.rl.datasets import load_rows
from polar_mq.graders.swebench import swebench_available
from tests.api.test_api import start_api

PY = sys.executable
FIX_CMD = "cd repo && sed -i 's/return a + b  # BUG/return a \\* b/' calc/__init__.py"


def swe_row(base: str, **over) -> dict:
    row = {"instance_id": "acme__calc-1", "repo": "acme/calc", "base_commit": base, "version": "0.1",
           "problem_statement": "mul(3, 4) returns 7 instead of 12", "created_at": "2024-01-01T00:00:00",
           "FAIL_TO_PASS": json.dumps(FAIL_TO_PASS), "PASS_TO_PASS": json.dumps(PASS_TO_PASS),
           "test_patch": "", "hints_text": ""}
    row.update(over)
    return row


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


# --- loader and builder (no servers) -------------------------------------------------------------
def test_every_local_format_reads_the_same_rows(tmp_path):
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"instruction": "a", "n": 1}, {"instruction": "b", "n": 2}]
    write_jsonl(tmp_path / "d.jsonl", rows)
    (tmp_path / "d.json").write_text(json.dumps({"data": rows}))
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "d.parquet")
    datasets.DatasetDict({"train": datasets.Dataset.from_list(rows)}).save_to_disk(str(tmp_path / "hf"))
    for name in ("d.jsonl", "d.json", "d.parquet", "hf"):
        got = load_rows(tmp_path / name)
        assert [(r.number, r.data) for r in got] == [(1, rows[0]), (2, rows[1])], name
    with pytest.raises(ValueError, match="does not exist"):
        load_rows(tmp_path / "missing.jsonl")
    (tmp_path / "d.csv").write_text("a,b\n")
    with pytest.raises(ValueError, match="unknown dataset format"):
        load_rows(tmp_path / "d.csv")


def test_swebench_rows_become_swebench_graded_tasks(tmp_path):
    template = {"agent": {"harness": "shell", "options": {"command": "true"}}, "runtime": {"backend": "docker"},
                "grader": {"strategy": "swebench", "config": {"repo_dir": "/testbed", "timeout": 900}},
                "metadata": {"run": "r1"}}
    rows = load_rows(write_jsonl(tmp_path / "swe.jsonl", [
        swe_row("abc123"),
        "{not json",
        swe_row("abc123", instance_id="acme__calc-2", FAIL_TO_PASS="[broken"),
        {"note": "neither shape"},
        swe_row("abc123", instance_id="django__django-11099", eval_script="#!/bin/bash\necho hi\n"),
    ]))
    built = build_tasks(rows, template, TaskOptions(samples=4, policy_version=7,
                                                    image_template="sweb.eval.x86_64.{instance_id}:latest"))
    assert [b.row for b in built] == [1, 2, 3, 4, 5]
    ok, bad_json, bad_f2p, no_shape, with_script = built
    assert "invalid JSON" in bad_json.error and "FAIL_TO_PASS is not a JSON list" in bad_f2p.error
    assert "no `instruction`" in no_shape.error
    task = ok.task
    assert task["task_id"] == "acme__calc-1-pv7" and task["num_samples"] == 4
    assert task["metadata"] == {"run": "r1", "instance_id": "acme__calc-1", "repo": "acme/calc", "policy_version": 7}
    assert "mul(3, 4) returns 7" in task["instruction"] and "acme/calc" in task["instruction"]
    assert task["runtime"]["image"] == "sweb.eval.x86_64.acme_1776_calc-1:latest"
    cfg = task["grader"]["config"]
    assert task["grader"]["strategy"] == "swebench" and cfg["repo_dir"] == "/testbed" and cfg["timeout"] == 900
    assert cfg["instance"]["FAIL_TO_PASS"] == FAIL_TO_PASS  # JSON string → list
    assert cfg["eval_command"] == "python -m pytest -rA -p no:cacheprovider tests/test_calc.py"
    assert with_script.task["runtime"]["image"] == "sweb.eval.x86_64.django_1776_django-11099:latest"
    assert "eval_command" not in with_script.task["grader"]["config"]
    # The user's instruction template wins; braces that are not row fields stay as written.
    custom = build_tasks(rows[:1], {**template, "instruction": "Fix {repo}: {problem_statement} {json}"},
                         TaskOptions(image_template="img-{instance_id}"))
    assert custom[0].task["instruction"] == "Fix acme/calc: mul(3, 4) returns 7 instead of 12 {json}"
    assert custom[0].task["task_id"] == "acme__calc-1"
    assert image_name("img/{instance_id_raw}", {"instance_id": "a__B"}) == "img/a__B"
    # images built here (polar-mq image build) are named in lower case, `__` kept
    assert image_name("sweb.eval.x86_64.{instance_id_lower}:latest", {"instance_id": "Org__Repo-7"}) == \
        "sweb.eval.x86_64.org__repo-7:latest"


def test_generic_rows_ids_and_selection(tmp_path):
    template = {"agent": {"harness": "shell", "options": {"command": "echo hi"}}, "num_samples": 2,
                "metadata": {"source": "tpl"}}
    rows = load_rows(write_jsonl(tmp_path / "g.jsonl", [
        {"instruction": "first", "task_id": "mine-1", "metadata": {"level": 3}},
        {"instruction": "second", "answer": 42},
        {"instruction": "third", "num_samples": 0},
        {"instruction": "fourth", "agent": {"options": {"command": "echo four"}}},
    ]))
    a = build_tasks(rows, template, TaskOptions(policy_version=2))
    b = build_tasks(rows, template, TaskOptions(policy_version=2))
    c = build_tasks(rows, template, TaskOptions(policy_version=3))
    assert a[0].task["task_id"] == "mine-1" and a[0].task["metadata"] == {"source": "tpl", "level": 3,
                                                                          "policy_version": 2}
    assert a[1].task["task_id"].startswith("row-") and a[1].task["task_id"] == b[1].task["task_id"]
    assert a[1].task["task_id"] != c[1].task["task_id"]  # the policy version is part of the id
    assert a[1].task["metadata"]["answer"] == 42
    assert "num_samples" in a[2].error
    assert a[3].task["agent"] == {"harness": "shell", "options": {"command": "echo four"}}
    shuffled = build_tasks(rows, template, TaskOptions(shuffle=True, seed=5, limit=3))
    again = build_tasks(rows, template, TaskOptions(shuffle=True, seed=5, limit=3))
    assert [x.row for x in shuffled] == [x.row for x in again] and len(shuffled) == 3


# --- the CLI against the real API and worker pools -----------------------------------------------
@pytest.fixture(scope="module")
def pipeline(gateway, tmp_path_factory):
    yield from running_pipeline(gateway, tmp_path_factory, "datasets", init=2, run=2, postrun=1)


@pytest.fixture(scope="module")
def api(pipeline, log_dir):
    server = start_api(log_dir, pipeline.redis_url, name="api-datasets")
    yield server.url
    stop(server.proc)


def cli(api: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "POLAR_API_TOKEN": "", "POLAR_HOME": os.environ.get("POLAR_HOME", "/tmp/polar-test-home")}
    return subprocess.run([PY, "-m", "polar_mq.cli", "submit", "--api", api, *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


def test_submit_generic_dataset_is_idempotent(api, pipeline, tmp_path):
    data = write_jsonl(tmp_path / "generic.jsonl", [
        {"instruction": "one", "task_id": "ds-generic-1"},
        {"instruction": "two", "metadata": {"k": "v"}},
        {"instruction": ""},
    ])
    template = tmp_path / "t.yaml"
    template.write_text(yaml.safe_dump({"agent": {"harness": "shell", "options": {"command": "echo hi"}},
                                        "runtime": {"backend": "local"}, "builder": {"strategy": "per_request"}}))
    first = cli(api, "--dataset", str(data), "--template", str(template), "--samples", "2", "--policy-version", "5")
    assert first.returncode == 1, first.stderr  # one bad row; the others went on
    ids = first.stdout.split()
    assert ids[0] == "ds-generic-1" and ids[1].startswith("row-") and len(ids) == 2
    assert "row 3: " in first.stderr and "2 created" in first.stderr
    again = cli(api, "--dataset", str(data), "--template", str(template), "--samples", "2", "--policy-version", "5")
    assert again.stdout.split() == ids and "0 created, 2 already submitted" in again.stderr
    client = Client(api, token="")
    status = client.status(ids[1])
    assert status["num_samples"] == 2 and status["request"]["metadata"] == {"k": "v", "policy_version": 5}
    recs = pipeline.wait(pipeline.store.session_ids(ids[1]), timeout=60)
    traj = pipeline.store.get_trajectory(recs[0].session_id)
    assert traj.metadata["policy_version"] == 5
    assert cli(api, "--dataset", str(tmp_path / "nope.jsonl")).returncode == 2


@pytest.mark.slow
@pytest.mark.skipif(swebench_available() != "5.0.2", reason="needs swebench==5.0.2: pip install 'polar_mq[swebench]'")
def test_submit_swe_gym_rows_graded_by_swebench(api, pipeline, tmp_path):
    src = tmp_path / "calc"
    base = make_repo(src)
    data = write_jsonl(tmp_path / "swe-gym.jsonl", [swe_row(base), swe_row(base, instance_id="acme__calc-2")])
    template = tmp_path / "swe.yaml"
    template.write_text(yaml.safe_dump({
        "agent": {"harness": "shell", "options": {"command": FIX_CMD}}, "timeout_seconds": 120,
        "runtime": {"backend": "local", "prepare": [{"upload": {"src": str(src), "dst": "repo"}}]},
        "builder": {"strategy": "per_request"},
        "grader": {"strategy": "swebench", "config": {
            "repo_dir": "repo", "repo_source": str(src), "timeout": 120,
            "eval_command": f"{PY} -m pytest -rA -p no:cacheprovider {{test_files}}"}}}))
    out = cli(api, "--dataset", str(data), "--template", str(template), "--policy-version", "1", "--limit", "1")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["acme__calc-1-pv1"]
    [rec] = pipeline.wait(pipeline.store.session_ids("acme__calc-1-pv1"), timeout=180)
    traj = pipeline.store.get_trajectory(rec.session_id)
    grade = traj.metadata["grade"]
    assert rec.state == "COMPLETED" and rec.reward == 1.0, grade
    assert sorted(grade["details"]["tests_status"]["FAIL_TO_PASS"]["success"]) == sorted(FAIL_TO_PASS)
    assert traj.metadata["policy_version"] == 1 and traj.metadata["instance_id"] == "acme__calc-1"
