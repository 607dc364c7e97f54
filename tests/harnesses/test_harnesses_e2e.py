"""Each of the six real agent CLIs runs a task end to end: the pipeline (real Celery workers) →
runtime (bwrap sandbox where available, else local) → harness shortcut → gateway → stand-in model,
which calls the CLI's file-writing tool (path from the ``polar:path=`` directive — absolute, as
Qwen needs) and then finishes.

Checked per CLI: the file is in the session's work dir, the session is COMPLETED, every model
call has an ``ok`` capture record, and prefix_merging gives one trace for the main chain (side
calls such as opencode's title request are separate traces, not labelled main).

The CLIs are installed with polar_mq.harnesses.install on first use (~1.4 GB for all six).

The default run (and so CI) takes Claude Code and Codex, the two harnesses no other test runs for
real; Gemini CLI (the slowest here, ~20-45 s), Qwen Code, opencode (also run for real by
test_harness_limits) and pi (also by test_real_cli, test_runtimes_docker and tests/vllm) are
marked ``full`` and run with POLAR_FULL=1 (README, "Tests").
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import requests

from tests.support.pipeline import agent_task, running_pipeline
from polar_mq import states
from polar_mq.harnesses import install
from polar_mq.harnesses.limits import resolve

HARNESSES = ["claude_code", "codex", "gemini_cli", "qwen_code", "opencode", "pi"]
DEFAULT = {"claude_code", "codex"}  # the rest: POLAR_FULL=1
BACKEND = "bwrap" if shutil.which("bwrap") else "local"
TASK_DIR = "/tmp/polar-task"  # the work dir inside the sandbox (its private /tmp)

pytestmark = [pytest.mark.cli,
              pytest.mark.skipif(not install.npm_available(), reason="node/npm not on PATH")]


@pytest.fixture(scope="module")
def pipeline(gateway, tmp_path_factory):
    yield from running_pipeline(gateway, tmp_path_factory, "harness-e2e", init=1, run=1, postrun=1)


def cli_bin(name: str) -> str:
    try:
        return str(install.install([name], timeout=900)[name])
    except install.InstallError as exc:
        pytest.skip(f"could not install {name} from npm: {exc}")


@pytest.mark.timeout(1200)  # the first run installs the CLI from npm
@pytest.mark.parametrize("harness", [h if h in DEFAULT else pytest.param(h, marks=pytest.mark.full)
                                     for h in HARNESSES])
def test_cli_end_to_end(harness, pipeline, gateway):
    cli_bin(harness)  # installed before the session's budget starts
    workdir = TASK_DIR if BACKEND == "bwrap" else None
    target = f"{TASK_DIR}/polar.txt" if workdir else None
    runtime = {"backend": BACKEND, **({"workdir": workdir} if workdir else {})}
    if target is None:  # local: the session work dir is known only at init; use a relative path
        instruction = "Create the file polar.txt polar:path=polar.txt"
    else:
        instruction = f"Create the file {target} polar:path={target}"
    _, [sid] = pipeline.submit(agent_task(
        num_samples=1, timeout_seconds=120, instruction=instruction, runtime=runtime,
        agent={"harness": harness, "model": "stand-in", "options": {}}))
    [rec] = pipeline.wait([sid], timeout=180)
    log = ""
    if rec.runtime:
        logf = Path(rec.runtime.session_dir, "logs", f"harness-{rec.attempt}.log")
        log = logf.read_text(errors="replace")[-3000:] if logf.exists() else ""
    assert rec.state == states.COMPLETED, (rec.state, rec.error, log)
    # (a shell tool, as Codex uses, adds a newline)
    assert Path(rec.runtime.workdir, "polar.txt").read_text().strip() == "hello from polar", log

    calls = gateway.calls(rec.gateway_session_id)
    assert len(calls) >= 2, log
    assert all(c["status"] == "ok" for c in calls), [c.get("error") for c in calls]
    traj = pipeline.store.get_trajectory(sid)
    assert traj.status == "COMPLETED" and traj.stats["calls"] == len(calls)
    roles = [t.metadata.get("role") for t in traj.traces]
    assert roles.count("main") == 1, roles
    main = traj.traces[roles.index("main")]
    assert len(main.call_ids) >= 2  # the tool round trip merged into one trace
    assert all(r != "main" for i, r in enumerate(roles) if traj.traces[i] is not main)
    # The output cap derived from the served model's max_model_len reached the CLI (Gemini CLI and
    # Qwen Code through the settings and env the shortcut writes) and the CLI asked for it.
    if harness in ("gemini_cli", "qwen_code"):
        health = requests.get(f"{gateway.url}/health", timeout=10).json()
        want = resolve(max(u.get("max_model_len") or 0 for u in health["upstreams"]) or None).max_output
        by_id = {c["call_id"]: c for c in calls}
        asked = [by_id[cid]["requested_params"].get("max_tokens") for cid in main.call_ids]
        assert asked and all(a == want for a in asked), (asked, want)
