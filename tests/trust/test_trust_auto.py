"""Runtime `auto` fails closed and a grader's fresh runtime is held to init's checks.

No isolation on a worker → the session is ERROR with the reason, never a silent `local`; a task
that names an image where no docker engine answers → ERROR, never bwrap on the host filesystem;
the prepare.exec init refuses on `local` is refused by a grader's fresh runtime as well (real
workers, real redis-server and a real local runtime; the worker's environment is what lacks
isolation)."""

from __future__ import annotations

import os
import stat

import pytest

from tests.support.pipeline import agent_task, make_pipeline
from polar_mq import runtimes
from polar_mq.graders.base import GradeContext, InfraError
from polar_mq.graders.workspace import fresh_workspace
from polar_mq.taskspec import RuntimeSpec


def test_select_backend_never_falls_back(monkeypatch):
    monkeypatch.setattr(runtimes, "docker_works", lambda: False)
    with pytest.raises(runtimes.NoIsolation, match="no docker engine"):
        runtimes.select_backend("python:3.12-slim")
    monkeypatch.setattr(runtimes, "bwrap_works", lambda: False)
    with pytest.raises(runtimes.NoIsolation, match="never chosen by auto"):
        runtimes.select_backend(None)


def test_auto_without_isolation_ends_the_session_in_error(gateway, tmp_path):
    # This worker's bubblewrap cannot make a sandbox (as where user namespaces are off) and its
    # docker engine does not answer.
    fakebin = tmp_path / "bin"
    fakebin.mkdir()
    (fakebin / "bwrap").write_text("#!/bin/sh\necho 'bwrap: No permissions to create new namespace' >&2\nexit 1\n")
    (fakebin / "bwrap").chmod(0o755)
    marker = tmp_path / "ran.txt"
    p = make_pipeline(gateway, tmp_path, PATH=f"{fakebin}:{os.environ['PATH']}",
                      DOCKER_HOST=f"unix://{tmp_path}/no-docker.sock")
    try:
        for stage in ("init", "run", "postrun"):
            p.start_worker(stage, 1)
        _, plain = p.submit(agent_task(num_samples=1, runtime={"prepare": [{"exec": f"touch {marker}"}]}))
        _, imaged = p.submit(agent_task(num_samples=1, runtime={"image": "python:3.12-slim"}))
        [a, b] = p.wait(plain + imaged, timeout=90)
        assert a.state == "ERROR" and "no isolation available" in a.error and a.runtime is None, a.error
        assert b.state == "ERROR" and "no docker engine" in b.error and b.runtime is None, b.error
        assert not marker.exists()
    finally:
        p.stop()


def test_fresh_grading_runtime_applies_inits_prepare_check(tmp_path, monkeypatch):
    marker = tmp_path / "m"
    spec = RuntimeSpec(backend="local", prepare=[{"exec": f"touch {marker}"}])
    monkeypatch.delenv("POLAR_ALLOW_LOCAL_EXEC", raising=False)
    with pytest.raises(InfraError, match="POLAR_ALLOW_LOCAL_EXEC"):
        with fresh_workspace(GradeContext(runtime_spec=spec, session_dir=tmp_path), {}):
            pass
    assert not marker.exists()
    monkeypatch.setenv("POLAR_ALLOW_LOCAL_EXEC", "1")  # the operator's choice on a trusted worker
    with fresh_workspace(GradeContext(runtime_spec=spec, session_dir=tmp_path), {}):
        assert marker.exists() and stat.S_ISREG(marker.stat().st_mode)
