"""A session of the RL demo (``examples.grpo.run --harness codex``: the pinned, unmodified Codex CLI
with the demo's configuration overrides) opened in the trajectory viewer, in Debian's real headless
chromium: the page shows the CLI's own requests (the system prompt it sends — the demo's
``codex_instructions.md`` — and its ``exec_command`` tool) as the harness sent them and as they
went upstream, and the linear session is ONE prefix-merged trace whose call markers are the
session's calls (docs/rl.md, "Sessions in the viewer"; issue 37's "a session of the demo opened in
the viewer").

The model is the stand-in (it answers ``polar:path=P`` with the CLI's shell tool, then ends the
turn), so this runs in the default suite without vLLM; the RL demo's own template
(``examples.grpo.run.template``) is submitted, grader included.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import requests

from tests.api.test_ui import CHROMIUM, CHROMIUM_FLAGS
from tests.support.pipeline import running_pipeline
from tests.support.servers import AUTH, ROOT, TOKEN, spawn, stop
from polar_mq import states
from polar_mq.cli.embedded_redis import free_port
from polar_mq.harnesses import install

sys.path.insert(0, str(ROOT))
from examples.grpo import codex_task, run as grpo_run  # noqa: E402

pytestmark = [pytest.mark.cli, pytest.mark.skipif(not install.npm_available(), reason="node/npm not on PATH")]


@pytest.fixture(scope="module")
def demo_session(gateway, tmp_path_factory, log_dir):
    """(api url, session id, its trajectory): one RL-demo Codex session, finished, behind an API."""
    install.install(["codex"], timeout=900)  # before the session's budget starts
    for p in running_pipeline(gateway, tmp_path_factory, "ui-codex", init=1, run=1, postrun=1):
        port = free_port()
        api = spawn([sys.executable, "-m", "polar_mq.cli", "api", "--host", "127.0.0.1", "--port", str(port),
                     "--redis", p.redis_url, "--workers", "1"],
                    f"http://127.0.0.1:{port}/health", log_dir, f"api-ui-codex-{port}", env=p.env)
        try:
            body = grpo_run.template(timeout=120, harness="codex")
            body["agent"]["model"] = "stand-in"
            body.update(instruction=f"Go up. polar:path={codex_task.ANSWER_FILE}", num_samples=1,
                        metadata={"target": "up", "policy_version": 0})
            task_id, [sid] = p.submit(body)
            [rec] = p.wait([sid], timeout=180)
            assert rec.state == states.COMPLETED, (rec.state, rec.error)
            url = f"http://127.0.0.1:{port}"
            results = requests.get(f"{url}/v1/tasks/{task_id}/results", headers=AUTH, timeout=30)
            assert results.status_code == 200, results.text
            [traj] = [t for t in results.json()["trajectories"] if t["session_id"] == sid]
            yield url, sid, traj
        finally:
            stop(api.proc)


@pytest.mark.timeout(600)
def test_a_demo_codex_session_in_the_viewer_shows_the_cli_requests_and_one_merged_trace(demo_session):
    if not os.path.exists(CHROMIUM):
        pytest.fail(f"{CHROMIUM} missing (apt-get install chromium)")
    sync_api = pytest.importorskip("playwright.sync_api")
    api, sid, traj = demo_session
    assert traj["stats"]["calls"] >= 2  # Codex's round trip: the tool call, then the final text
    [trace] = traj["traces"]  # a linear session: one prefix-merged trace
    assert len(trace["call_ids"]) == traj["stats"]["calls"]
    instructions = codex_task.INSTRUCTIONS.read_text().strip()
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        try:
            page = browser.new_context(viewport={"width": 1400, "height": 1000}).new_page()
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.goto(f"{api}/ui/?token={TOKEN}")
            page.goto(f"{api}/ui/sessions/{sid}")
            page.wait_for_selector("body[data-ready='1'] [data-trace-index]")
            assert page.locator("[data-trace-index]").count() == 1
            shown = page.locator("[data-trace-index] [data-token-id]").count()
            assert shown == len(trace["prompt_ids"]) + len(trace["response_ids"])
            assert page.locator("[data-trace-index] .boundary").count() == len(trace["call_ids"])
            assert page.locator("#calls [data-call-index]").count() == traj["stats"]["calls"]
            for index in range(traj["stats"]["calls"]):
                page.click(f"#calls [data-call-index='{index}']")
            page.wait_for_selector("text=request as the harness sent it")
            page.wait_for_function(f"document.querySelectorAll('.req').length === {traj['stats']['calls']}")
            sent = page.locator(".req > div:first-child pre").all_inner_texts()
            upstream = page.locator(".req > div:nth-child(2) pre").all_inner_texts()
            assert len(sent) == traj["stats"]["calls"]
            for harness_request, upstream_request in zip(sent, upstream):
                # Codex's own Responses request: its instructions (the demo's system prompt) and tools
                # Codex's own Responses request: its system prompt (the demo's instructions file, sent by
                # Codex 0.171 as a `developer` input item) and its own tools; upstream, the same prompt as
                # the chat's system message and the same tools
                sent_json, upstream_json = json.loads(harness_request), json.loads(upstream_request)
                developer = [i for i in sent_json["input"] if i.get("role") == "developer"]
                assert any(instructions in json.dumps(i) for i in developer), developer
                assert "exec_command" in [t.get("name") for t in sent_json["tools"]]
                system = [m for m in upstream_json["messages"] if m["role"] == "system"]
                assert any(instructions in json.dumps(m) for m in system), system
                assert "exec_command" in [t["function"]["name"] for t in upstream_json["tools"]]
            page.screenshot(path=str(Path(os.environ.get("POLAR_TEST_ARTIFACTS") or ROOT / "test-artifacts")
                                     / "ui-codex-session.png"), full_page=True)
            assert not errors, errors
        finally:
            browser.close()
