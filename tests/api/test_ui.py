"""The trajectory viewer (/ui/ on the rollout API) in Debian's real headless chromium, driven by
Playwright, against a finished task run by real Celery worker pools through the real gateway.

Screenshots are kept as test artifacts in $POLAR_TEST_ARTIFACTS/ui (default test-artifacts/ui).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import requests

from tests.support.servers import AUTH, ROOT, TOKEN, spawn, stop
from tests.support.pipeline import agent_task, make_pipeline
from polar_mq import states
from polar_mq.cli.embedded_redis import free_port

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run"]
ARTIFACTS = Path(os.environ.get("POLAR_TEST_ARTIFACTS") or ROOT / "test-artifacts") / "ui"
BRANCHING_AGENT = ROOT / "tests" / "support" / "ui_branching_agent.py"


class Stack:
    def __init__(self, api: str, pipeline, demo_task: str, demo_sids: list[str], branch_task: str,
                 branch_sid: str):
        self.api, self.pipeline = api, pipeline
        self.demo_task, self.demo_sids = demo_task, demo_sids
        self.branch_task, self.branch_sid = branch_task, branch_sid

    def get(self, path: str, **kw):
        return requests.get(f"{self.api}{path}", headers=AUTH, timeout=30, **kw)


def _gateway_admin(gateway) -> dict[str, str]:
    return dict(gateway.admin_headers)


def _submit(api: str, body: dict) -> tuple[str, list[str]]:
    resp = requests.post(f"{api}/v1/tasks", json=body, headers=AUTH, timeout=30)
    assert resp.status_code == 202, resp.text
    return resp.json()["task_id"], resp.json()["session_ids"]


@pytest.fixture(scope="module")
def stack(gateway, tmp_path_factory, log_dir):
    p = make_pipeline(gateway, tmp_path_factory.mktemp("ui"))
    p.start_worker("init", 1)
    p.start_worker("run", 2)
    p.start_worker("postrun", 1)
    port = free_port()
    api = spawn([sys.executable, "-m", "polar_mq.cli", "api", "--host", "127.0.0.1", "--port", str(port),
                 "--redis", p.redis_url, "--workers", "1"],
                f"http://127.0.0.1:{port}/health", log_dir, f"api-ui-{port}", env=p.env)
    url = f"http://127.0.0.1:{port}"
    try:
        demo, demo_sids = _submit(url, agent_task(num_samples=3, grader={"strategy": "completion"},
                                                  metadata={"group_id": "ui", "policy_version": 7}))
        branch, branch_sids = _submit(url, agent_task(
            num_samples=1, instruction="Write hello into polar.txt",
            agent={"harness": "shell", "model": "policy",
                   "options": {"command": [sys.executable, str(BRANCHING_AGENT)]}},
            grader={"strategy": "test_runner", "config": {
                "command": "printf 'PASSED tests/test_hello.py::test_file\\nFAILED tests/test_hello.py::test_disk\\n'",
                "format": "lines", "reward": "fraction"}}))
        recs = p.wait(demo_sids + branch_sids, timeout=120)
        assert [r.state for r in recs] == [states.COMPLETED] * 4, [(r.state, r.error) for r in recs]
        yield Stack(url, p, demo, demo_sids, branch, branch_sids[0])
    finally:
        stop(api.proc)
        p.stop()


def _trajectories(stack: Stack, task_id: str) -> dict[str, dict]:
    resp = stack.get(f"/v1/tasks/{task_id}/results")
    assert resp.status_code == 200, resp.text
    return {t["session_id"]: t for t in resp.json()["trajectories"]}


# --- sign-in ------------------------------------------------------------------------------------
def test_sign_in_with_token_sets_a_cookie_that_only_opens_the_viewer(stack):
    page = requests.get(f"{stack.api}/ui/", timeout=10)
    assert page.status_code == 401 and "text/html" in page.headers["Content-Type"]
    assert 'name="token"' in page.text  # a sign-in form, not a JSON error
    data = requests.get(f"{stack.api}/ui/api/tasks", timeout=10)
    assert data.status_code == 401 and data.headers["Content-Type"].startswith("application/problem+json")
    assert requests.get(f"{stack.api}/ui/?token=wrong", timeout=10).status_code == 401

    s = requests.Session()
    signed = s.get(f"{stack.api}/ui/?token={TOKEN}&x=1", allow_redirects=False, timeout=10)
    assert signed.status_code == 303 and signed.headers["Location"] == "/ui/?x=1"  # the token leaves the URL
    cookie = signed.headers["Set-Cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/ui" in cookie
    assert TOKEN not in cookie
    assert s.get(f"{stack.api}/ui/", timeout=10).status_code == 200
    tasks = s.get(f"{stack.api}/ui/api/tasks", timeout=10)
    assert tasks.status_code == 200 and stack.demo_task in [t["task_id"] for t in tasks.json()["tasks"]]
    # The cookie is for the read-only viewer only: the API proper still wants the bearer.
    assert s.get(f"{stack.api}/v1/tasks", timeout=10).status_code == 401
    assert s.post(f"{stack.api}/v1/tasks", json={"instruction": "x"}, timeout=10).status_code == 401
    # The bearer header signs a browser in too.
    via_bearer = requests.get(f"{stack.api}/ui/", headers=AUTH, timeout=10)
    assert via_bearer.status_code == 200 and "polar_mq_ui=" in via_bearer.headers["Set-Cookie"]
    assert requests.get(f"{stack.api}/ui/", headers={"Authorization": "Bearer nope"}, timeout=10).status_code == 401


def test_json_endpoints_answer_missing_things_with_problems(stack):
    assert stack.get("/ui/api/sessions/nope").status_code == 404
    assert stack.get("/ui/api/tasks/nope").status_code == 404
    assert stack.get("/ui/api/groups/nope").status_code == 404
    assert stack.get(f"/ui/api/sessions/{stack.demo_sids[0]}/calls/999").status_code == 404
    bad = stack.get("/ui/api/tasks", params={"limit": "many"})
    assert bad.status_code == 400 and bad.json()["field"] == "limit"


def test_call_detail_has_the_request_as_sent_by_the_harness_and_upstream(stack, gateway):
    rec = stack.pipeline.store.get_session(stack.demo_sids[0])
    recorded = gateway.calls(rec.gateway_session_id)
    detail = stack.get(f"/ui/api/sessions/{stack.demo_sids[0]}/calls/1").json()
    assert detail["call_id"] == recorded[1]["call_id"]
    assert detail["request"] == recorded[1]["request"]  # what the openai SDK sent
    assert detail["upstream_request"]["messages"] == recorded[1]["messages"]
    assert detail["upstream_request"]["model"] == recorded[1]["model_served"]
    assert detail["tokens_in"] == len(recorded[1]["prompt_token_ids"])
    assert detail["tokens_out"] == len(recorded[1]["completion_token_ids"])


def test_group_view_has_every_sample_with_rewards_and_advantages(stack):
    group = stack.get(f"/ui/api/groups/{stack.demo_task}").json()
    assert [s["session_id"] for s in group["samples"]] == stack.demo_sids
    assert group["mean_reward"] == 1.0 and group["reward_std"] == 0.0 and group["policy_version"] == 7
    assert all(s["reward"] == 1.0 and s["advantage"] == 0.0 for s in group["samples"])


# --- the browser --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def browser():
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"{CHROMIUM} missing (apt-get install chromium)")
    sync_api = pytest.importorskip("playwright.sync_api")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_api.sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        yield b
        b.close()


@pytest.fixture()
def page(browser, stack):
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    pg = context.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda exc: errors.append(str(exc)))
    pg.goto(f"{stack.api}/ui/?token={TOKEN}")
    pg.wait_for_selector("body[data-ready='1']")
    yield pg
    context.close()
    assert not errors, errors


def _rendered_traces(pg) -> list[dict]:
    return pg.evaluate("""() => [...document.querySelectorAll('[data-trace-index]')].map(sec => ({
        index: Number(sec.dataset.traceIndex),
        ids: [...sec.querySelectorAll('[data-token-id]')].map(e => Number(e.dataset.tokenId)),
        masks: [...sec.querySelectorAll('[data-token-id]')].map(e => Number(e.dataset.lossMask)),
        classes: [...sec.querySelectorAll('[data-token-id]')].map(e => e.className),
        logprobs: [...sec.querySelectorAll('[data-token-id]')].map(e => e.dataset.logprob ?? null),
        text: [...sec.querySelectorAll('[data-token-id]')].map(e => e.textContent.replaceAll('↵\\n', '\\n')).join(''),
        boundaries: sec.querySelectorAll('.boundary').length,
        diff: sec.querySelector('[data-diff-kind]')?.dataset.diffKind ?? null,
    }))""")


def _detokenize(upstream: str, ids: list[int]) -> str:
    resp = requests.post(f"{upstream}/detokenize", json={"model": "stand-in", "tokens": ids}, timeout=30)
    assert resp.status_code == 200, resp.text
    return resp.json()["prompt"]


def _check_token_view(pg, traj: dict, upstream: str) -> list[dict]:
    rendered = _rendered_traces(pg)
    assert [r["index"] for r in rendered] == list(range(len(traj["traces"])))
    for r, trace in zip(rendered, traj["traces"]):
        assert r["ids"] == trace["prompt_ids"] + trace["response_ids"]
        assert r["masks"] == [0] * len(trace["prompt_ids"]) + trace["loss_mask"]
        assert all(f"m{m}" in c.split() for m, c in zip(r["masks"], r["classes"]))  # the colour class
        lps = trace["response_logprobs"]
        shown = r["logprobs"][len(trace["prompt_ids"]):]
        for mask, lp, seen in zip(trace["loss_mask"], lps, shown):
            assert (seen is None) if not mask else float(seen) == pytest.approx(lp)
        # Each token's text, put together, is the upstream's own decoding of the whole sequence.
        assert r["text"] == _detokenize(upstream, r["ids"])
        assert r["boundaries"] == len(trace["call_ids"])
    return rendered


def test_session_token_view_matches_the_trajectory(stack, page, gateway):
    trajs = _trajectories(stack, stack.demo_task)
    page.screenshot(path=str(ARTIFACTS / "tasks.png"))
    page.click(f"[data-task-id='{stack.demo_task}'] a")
    page.wait_for_selector("#sessions [data-session-id]")
    assert page.locator("#sessions [data-session-id]").count() == 3
    page.screenshot(path=str(ARTIFACTS / "task.png"))
    sid = stack.demo_sids[0]
    page.click(f"[data-session-id='{sid}'] a")
    page.wait_for_url(f"**/ui/sessions/{sid}")
    page.wait_for_selector("body[data-ready='1'] [data-trace-index]")
    assert page.locator("#token-error").count() == 0
    rendered = _check_token_view(page, trajs[sid], gateway.upstream_url)
    assert sum(rendered[0]["masks"]) == sum(trajs[sid]["traces"][0]["loss_mask"]) > 0
    assert page.locator("#calls [data-call-index]").count() == trajs[sid]["stats"]["calls"]
    page.screenshot(path=str(ARTIFACTS / "session.png"), full_page=True)
    page.locator("section.trace").first.screenshot(path=str(ARTIFACTS / "token-view.png"))

    page.select_option("#colour-mode", "logprob")
    assert "heat" in page.locator("#traces").get_attribute("class")
    page.locator("section.trace").first.screenshot(path=str(ARTIFACTS / "token-view-logprob.png"))

    page.click("#calls [data-call-index='0']")
    page.wait_for_selector("text=request as the harness sent it")
    page.screenshot(path=str(ARTIFACTS / "call-detail.png"))

    for other in stack.demo_sids[1:]:  # every session of the task, not only the first
        page.goto(f"{stack.api}/ui/sessions/{other}")
        page.wait_for_selector("body[data-ready='1'] [data-trace-index]")
        _check_token_view(page, trajs[other], gateway.upstream_url)


def test_forks_and_chain_breaks_are_marked_with_a_prompt_diff(stack, page, gateway):
    traj = _trajectories(stack, stack.branch_task)[stack.branch_sid]
    assert traj["stats"]["break_kinds"] == {"fork": 1, "template_change": 1}
    page.goto(f"{stack.api}/ui/sessions/{stack.branch_sid}")
    page.wait_for_selector("body[data-ready='1'] [data-trace-index]")
    rendered = _check_token_view(page, traj, gateway.upstream_url)
    kinds = {r["index"]: r["diff"] for r in rendered}
    for i, trace in enumerate(traj["traces"]):
        meta = trace["metadata"]
        expected = meta["break"] or ("fork" if meta["parent_trace"] is not None else None)
        assert kinds[i] == expected
    # The tree: every trace once, each branch under the trace it branches from.
    tree = page.locator("#lineage-tree [data-tree-trace]")
    assert tree.count() == len(traj["traces"])
    for i, trace in enumerate(traj["traces"]):
        parent = trace["metadata"]["parent_trace"]
        if parent is None:
            parent = trace["metadata"]["continues_trace"]
        node = page.locator(f"#lineage-tree [data-tree-trace='{i}']")
        assert node.get_attribute("data-tree-parent") == ("" if parent is None else str(parent))
    fork = page.locator("[data-diff-kind='fork']")
    sides = [fork.locator("pre.ours").inner_text(), fork.locator("pre.theirs").inner_text()]
    # The two continuations of the same tool call: one side each (which is the fork is the builder's call).
    assert sorted("error: disk full" in side for side in sides) == [False, True]
    assert sorted("wrote 16 bytes" in side for side in sides) == [False, True]
    broken = page.locator("[data-diff-kind='template_change']")
    assert "Turn 2 of the session." in broken.locator("pre.ours").inner_text()
    # The grade with its per-test statuses.
    assert traj["reward"] == 0.5
    rows = page.locator("#tests tbody tr")
    statuses = {rows.nth(i).locator("td").nth(0).inner_text(): rows.nth(i).locator("td").nth(1).inner_text()
                for i in range(rows.count())}
    assert statuses == {"tests/test_hello.py::test_file": "PASSED", "tests/test_hello.py::test_disk": "FAILED"}
    page.screenshot(path=str(ARTIFACTS / "session-branches.png"), full_page=True)
    page.locator("section.trace", has=fork).screenshot(path=str(ARTIFACTS / "token-view-fork.png"))


def test_group_page_shows_the_samples_side_by_side(stack, page):
    page.goto(f"{stack.api}/ui/groups/{stack.demo_task}")
    page.wait_for_selector("body[data-ready='1'] #group")
    cards = page.locator("#group [data-session-id]")
    assert [cards.nth(i).get_attribute("data-session-id") for i in range(cards.count())] == stack.demo_sids
    assert "advantage" in cards.first.inner_text()
    page.screenshot(path=str(ARTIFACTS / "group.png"))


# --- API metrics and polar-mq top -----------------------------------------------------------------
def test_api_metrics_have_stage_duration_and_ready_occupancy_histograms(stack):
    from prometheus_client.parser import text_string_to_metric_families

    resp = stack.get("/metrics")
    assert resp.status_code == 200
    families = {f.name: f for f in text_string_to_metric_families(resp.text)}
    stage = families["polar_mq_stage_seconds"]
    assert stage.type == "histogram"
    by_stage: dict[str, dict[str, float]] = {}
    for s in stage.samples:
        entry = by_stage.setdefault(s.labels["stage"], {})
        if s.name.endswith("_bucket"):
            entry.setdefault("buckets", []).append(s.value)
        else:
            entry[s.name.rsplit("_", 1)[1]] = s.value
    # What the histogram must hold, from every session's own history: each state left once, for
    # as long as the history says; READY observed at each hand-in and each take-out.
    store = stack.pipeline.store
    records = store.get_sessions(sid for task in store.list_tasks(1000) for sid in store.session_ids(task))
    expected: dict[str, list[float]] = {}
    ready_events = 0
    for rec in records:
        for (state, t0, _), (nxt, t1, _) in zip(rec.history, rec.history[1:]):
            if nxt != state:
                expected.setdefault(state, []).append(t1 - t0)
            ready_events += (nxt == "READY" and state != "READY") + (state == "READY" and nxt == "RUNNING")
    assert expected["RUNNING"] and set(expected) <= set(by_stage)
    for name, seconds in expected.items():
        assert by_stage[name]["count"] == len(seconds), (name, by_stage[name])
        assert by_stage[name]["sum"] == pytest.approx(sum(seconds), abs=0.05)
        assert by_stage[name]["buckets"] == sorted(by_stage[name]["buckets"])
        assert by_stage[name]["buckets"][-1] == len(seconds)  # +Inf
    ready = families["polar_mq_ready_occupancy"]
    count = next(s.value for s in ready.samples if s.name.endswith("_count"))
    assert count == ready_events > 0


def test_top_under_a_pseudo_terminal(stack):
    import pty
    import select
    import subprocess

    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "polar_mq.cli", "top", "--api", stack.api, "--token", TOKEN,
                             "--interval", "0.3", "--iterations", "3"], stdin=slave, stdout=slave, stderr=slave,
                            env={**os.environ, "COLUMNS": "100", "LINES": "40", "TERM": "xterm-256color"},
                            close_fds=True)
    os.close(slave)
    out = b""
    try:
        while True:
            ready, _, _ = select.select([master], [], [], 30)
            if not ready:
                break
            try:
                chunk = os.read(master, 65536)
            except OSError:  # the child closed the terminal
                break
            if not chunk:
                break
            out += chunk
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)
    text = out.decode("utf-8", errors="replace")
    assert "\x1b[" in text  # a live (redrawn) terminal view, not plain prints
    assert text.count("stage pools") >= 3  # three refreshes
    for word in ("init", "run", "postrun", "READY", "RUNNING", "COMPLETED"):
        assert word in text
    assert "0/2 slots held" in text  # READY capacity of this pipeline (POLAR_READY_CAPACITY=2)


def test_grafana_dashboard_queries_only_metrics_the_services_export(stack, gateway):
    """Every polar_mq_* series a dashboard panel reads is one the API or the gateway exports (the
    gateway's as declared: series with labels appear once something was observed)."""
    import json
    import re

    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from polar_mq.proxy_app.web.metrics import GatewayMetrics

    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}
    exported: set[str] = set()
    declared = generate_latest(GatewayMetrics().registry).decode()
    live = requests.get(f"{gateway.url}/metrics", headers=_gateway_admin(gateway), timeout=10).text
    for text in (stack.get("/metrics").text, live, declared):
        for family in text_string_to_metric_families(text):
            exported.update(family.name + s for s in suffixes.get(family.type, ("",)))
    dash = json.loads((ROOT / "compose" / "grafana" / "dashboards" / "polar_mq.json").read_text())
    queried = {name for p in dash["panels"] for t in p.get("targets", [])
               for name in re.findall(r"polar_mq_[a-z0-9_]+", t["expr"])}
    assert queried and queried <= exported, sorted(queried - exported)


def test_a_running_session_shows_a_live_trajectory(stack):
    import time

    _, sids = _submit(stack.api, agent_task(num_samples=1, instruction="Write hello into polar.txt polar:sleep=2"))
    deadline = time.time() + 60
    live = None
    while time.time() < deadline and live is None:
        page = stack.get(f"/ui/api/sessions/{sids[0]}").json()
        if page["session"]["state"] == states.RUNNING and page["calls"]:
            live = page
        time.sleep(0.2)
    assert live is not None, "never saw the session running with a recorded call"
    assert live["trajectory"]["source"] == "live" and live["traces"]
    assert live["traces"][0]["call_ids"] == [c["call_id"] for c in live["calls"]][:len(live["traces"][0]["call_ids"])]
    stack.pipeline.wait(sids, timeout=60)
    done = stack.get(f"/ui/api/sessions/{sids[0]}").json()
    assert done["trajectory"]["source"] == "result" and len(done["calls"]) > len(live["calls"])
