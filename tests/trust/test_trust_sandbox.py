"""The sandbox reaches its own session's gateway endpoints and nothing else, tried from inside a
real bwrap sandbox of a task run by `polar-mq up` (polar_mq.cli.up.launch: API, gateway, the three
pools and Flower as real processes): not the API, Redis or Flower, not the gateway's /sessions or
/health, not another session (its key in the URL, a header or the query), not by smuggling a
second request, not the token file or another session's files. The task names no runtime: the
default picks the safest available, bwrap here."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import uuid
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import requests

from tests.support.servers import AUTH, ROOT, TOKEN
from polar_mq.client import Client
from polar_mq.cli.embedded_redis import free_port
from polar_mq.runtimes import bwrap_works

pytestmark = pytest.mark.skipif(not bwrap_works(), reason="bubblewrap cannot make a sandbox here")
PROBE = ROOT / "tests" / "support" / "sandbox_probe.py"


@pytest.fixture()
def stack(monkeypatch):
    """`polar-mq up` with its state outside /tmp (the sandbox's /tmp is private anyway: this makes
    the hiding of host paths what is tested)."""
    from polar_mq.cli.up import launch

    base = Path("/var/tmp") / f"polar-trust-{uuid.uuid4().hex[:8]}"
    home, sessions, results = base / "home", base / "sessions", base / "results"
    home.mkdir(parents=True)
    (home / "token").write_text(TOKEN + "\n")
    (home / "token").chmod(0o600)
    env = {"POLAR_HOME": str(home), "POLAR_SESSIONS_DIR": str(sessions), "POLAR_RESULTS_DIR": str(results),
           "POLAR_LOG_DIR": str(base / "logs")}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    st = launch(api_port=free_port(), gateway_port=free_port(), flower_port=free_port(), flower=True,
                concurrency=(1, 1, 1), extra_env=env)
    try:
        yield st, base
    finally:
        st.stop()
        shutil.rmtree(base, ignore_errors=True)


def test_sandbox_reaches_only_its_own_session(stack):
    st, base = stack
    # Another session with a call of its own, and a file of it on disk (as a harness config would be).
    other = requests.post(f"{st.gateway_url}/sessions", json={"session_id": "victim"}, headers=AUTH,
                          timeout=10).json()
    chat = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi polar:notool"}]}
    assert requests.post(f"{other['base_urls']['openai']}/chat/completions", json=chat, timeout=30).ok
    other_dir = base / "sessions" / "victim-task" / "victim" / "home"
    other_dir.mkdir(parents=True)
    (other_dir / "config.json").write_text(json.dumps({"api_key": other["key"]}))
    # Flower is behind the token for the host too.
    assert requests.get(f"{st.flower_url}/api/workers", timeout=10).status_code == 401

    redis_url = urlsplit(st.redis_url)
    assert redis_url.password  # `polar-mq up`'s Redis has one; the sandbox gets only host:port
    redis_hostport = f"{redis_url.hostname}:{redis_url.port}"
    task = {"instruction": "probe", "num_samples": 1, "timeout_seconds": 120,
            "agent": {"harness": "shell", "options": {"command": [sys.executable, str(PROBE)]}},
            "runtime": {"keep_workdir": True, "env": {"PROBE_API": urlsplit(st.api_url).netloc, "PROBE_REDIS": redis_hostport,
                                "PROBE_FLOWER": urlsplit(st.flower_url).netloc, "PROBE_OTHER_KEY": other["key"],
                                "PROBE_TOKEN_FILE": str(base / "home" / "token"),
                                "PROBE_OTHER_DIR": str(other_dir)}}}
    client = Client(st.api_url, token=st.token)
    sub = client.submit(task)
    final = client.wait(sub["task_id"], timeout=120, poll=0.5)
    sess = client.session(sub["session_ids"][0])
    assert final["sessions"][0]["state"] == "COMPLETED", sess.get("error")
    assert sess["runtime"]["backend"] == "bwrap"  # the default: the safest runtime available
    got = json.loads(Path(sess["runtime"]["workdir"], "probe.json").read_text())

    assert got["own_chat"] == 200 and got["own_key_as_header"] == 200, got
    for name in ("sessions_list", "sessions_create", "gateway_health", "other_in_url", "other_as_header",
                 "other_as_query"):
        assert got[name] == 403, (name, got)
    for name in ("api", "redis", "flower", "internet"):
        assert str(got[name]).startswith("refused"), (name, got)
    assert got["smuggle_answers"] == 1, got
    assert got["token_file"].startswith("hidden") and got["other_dir"].startswith("hidden"), got
    assert got["docker_socket"] == "hidden"

    # The other session is untouched: no call injected into it, and the probe's calls are its own.
    calls = requests.get(f"{st.gateway_url}/sessions/victim/calls", headers=AUTH, timeout=10).json()["calls"]
    assert len(calls) == 1
    own = requests.get(f"{st.gateway_url}/sessions/{sess['gateway_session_id']}/calls", headers=AUTH,
                       timeout=10).json()["calls"]
    assert len(own) == 3  # own_chat, own_key_as_header, the smuggling connection's one allowed request


def test_local_refuses_prepare_exec_unless_allowed(gateway, tmp_path):
    """A submitted task's prepare.exec never runs on the local runtime (no isolation) unless the
    worker was started with POLAR_ALLOW_LOCAL_EXEC=1; the session ends in ERROR saying why."""
    from tests.support.pipeline import agent_task, make_pipeline

    marker = tmp_path / "ran.txt"
    p = make_pipeline(gateway, tmp_path)
    try:
        for stage in ("init", "run", "postrun"):
            p.start_worker(stage, 1)
        _, sids = p.submit(agent_task(num_samples=1, runtime={"backend": "local", "prepare": [
            {"exec": f"echo pwned > {marker}"}]}))
        [rec] = p.wait(sids, timeout=60)
        assert rec.state == "ERROR" and "POLAR_ALLOW_LOCAL_EXEC" in rec.error
        assert not marker.exists()
    finally:
        p.stop()


# ---- allow_internet: the internet, not the hub (runtimes/egress.py) -----------------------------

EGRESS_PROBE = ROOT / "tests" / "support" / "egress_probe.py"


@pytest.fixture(scope="module")
def egress_hub(log_dir):
    """A hub whose Redis (with a password) and API listen on every address of this host, and an
    "outside" listener in a network namespace of its own (standing in for the internet)."""
    from tests.support.egress_net import root_reason, start_outside
    from tests.support.servers import spawn, stop

    why = root_reason()
    if why:
        pytest.skip(why)
    base = Path("/var/tmp") / f"polar-egress-{uuid.uuid4().hex[:8]}"
    base.mkdir(parents=True)
    rport, aport = free_port(), free_port()
    conf = base / "redis.conf"
    conf.write_text('requirepass "egress-pw"\n')
    redis_proc = subprocess.Popen(["redis-server", str(conf), "--port", str(rport), "--bind", "0.0.0.0",
                                   "--protected-mode", "no", "--save", "", "--dir", str(base)],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    redis_url = f"redis://:egress-pw@127.0.0.1:{rport}/0"
    outside = api = None
    try:
        api = spawn([sys.executable, "-m", "polar_mq.cli", "api", "--host", "0.0.0.0", "--port", str(aport),
                     "--redis", redis_url, "--workers", "1"], f"http://127.0.0.1:{aport}/health", log_dir,
                    f"api-egress-{aport}")
        outside = start_outside()
        yield {"redis_url": redis_url, "redis_port": rport, "api_url": f"http://127.0.0.1:{aport}",
               "api_port": aport, "outside": outside}
    finally:
        if outside is not None:
            outside.close()
        if api is not None:
            stop(api.proc)
        redis_proc.terminate()
        redis_proc.wait(timeout=10)
        shutil.rmtree(base, ignore_errors=True)


def _egress_targets(hub) -> dict[str, str]:
    from tests.support.egress_net import host_ip

    ip = host_ip()
    # The hub really is there on both addresses, for this host: a refusal inside is the sandbox's.
    for port in (hub["redis_port"], hub["api_port"]):
        for host in ("127.0.0.1", ip):
            socket.create_connection((host, port), 3).close()
    return {"redis_loopback": f"127.0.0.1:{hub['redis_port']}", "redis_host": f"{ip}:{hub['redis_port']}",
            "api_loopback": f"127.0.0.1:{hub['api_port']}", "api_host": f"{ip}:{hub['api_port']}",
            "metadata": "169.254.169.254:80", "outside": hub["outside"].target}


def _assert_egress(got: dict) -> None:
    assert got["outside"] == "CONNECTED outside", got  # the "internet" is reachable
    assert got["own_chat"] == 200, got  # and its own gateway session, through the forwarder
    for name in ("redis_loopback", "redis_host", "api_loopback", "api_host", "metadata"):
        assert str(got[name]).startswith("refused"), (name, got)


def _probe_result(log_path: Path) -> dict:
    lines = [ln for ln in log_path.read_text(errors="replace").splitlines() if ln.startswith("PROBE ")]
    assert lines, log_path.read_text(errors="replace")[-3000:]
    return json.loads(lines[-1][len("PROBE "):])


def test_bwrap_with_internet_reaches_the_outside_but_not_the_hub(egress_hub, gateway, tmp_path, monkeypatch):
    """bwrap + allow_internet: slirp4netns gives the sandbox the outside; the hub's Redis and API
    (loopback and the host's address) and 169.254.169.254 are refused; the gateway works."""
    from polar_mq.runtimes.bwrap import BwrapRuntime
    from polar_mq.runtimes.netbridge import sandbox_urls
    from polar_mq.taskspec import RuntimeSpec

    monkeypatch.setenv("POLAR_REDIS_URL", egress_hub["redis_url"])
    monkeypatch.setenv("POLAR_API_URL", egress_hub["api_url"])
    targets = _egress_targets(egress_hub)
    sess = gateway.new_session()
    rt = BwrapRuntime()
    handle = rt.start(RuntimeSpec(backend="bwrap", allow_internet=True), tmp_path / "s", "egress-bwrap")
    handle = handle.updated(gateway_urls=list(sess["base_urls"].values()))
    assert rt.bridges_gateway(handle)
    log = tmp_path / "probe.log"
    res = rt.exec(handle, [sys.executable, str(EGRESS_PROBE)], timeout=90, log_path=log,
                  env={"OPENAI_BASE_URL": sandbox_urls(sess["base_urls"])["openai"],
                       "PROBE_TARGETS": json.dumps(targets)})
    assert res.exit_code == 0, res.output_tail
    got = _probe_result(log)
    _assert_egress(got)
    assert got["resolv"] == "nameserver 10.0.2.3", got  # names resolve through slirp4netns
    assert got["route_del"].startswith("refused"), got  # no capability to lift the blocks
    assert len(gateway.calls(sess["session_id"])) == 1
    # The control: the operator's opt-out (the host network) reaches the hub, so the refusals
    # above are the sandbox's doing.
    monkeypatch.setenv("POLAR_SANDBOX_HOST_NETWORK", "1")
    assert not rt.bridges_gateway(handle)
    res = rt.exec(handle, [sys.executable, str(EGRESS_PROBE)], timeout=90, log_path=log,
                  env={"OPENAI_BASE_URL": sess["base_urls"]["openai"], "PROBE_TARGETS": json.dumps(targets)})
    shared = _probe_result(log)
    assert shared["redis_host"].startswith("CONNECTED") and shared["api_loopback"].startswith("CONNECTED"), shared


def test_docker_with_internet_reaches_the_outside_but_not_the_hub(egress_hub, gateway, tmp_path, monkeypatch):
    """docker + allow_internet: a bridge network (not the host's), the gateway bridged into the
    container, and the POLAR-EGRESS iptables chain rejecting the hub's addresses; without that
    chain the same container reaches the hub on the host's address (the control)."""
    from tests.support.docker_engine import start_engine
    from polar_mq.runtimes import egress
    from polar_mq.runtimes.docker import DockerRuntime
    from polar_mq.runtimes.netbridge import sandbox_urls
    from polar_mq.taskspec import RuntimeSpec

    eng, why = start_engine()
    if eng is None:
        pytest.skip(f"no Docker engine: {why}")
    network = f"pe{uuid.uuid4().hex[:6]}"
    bridge = egress.bridge_ifname(network)
    forward = Path("/proc/sys/net/ipv4/ip_forward")
    was = forward.read_text().strip()
    rt = handle = None
    try:
        forward.write_text("1\n")  # the host routes the bridge to the "outside" (dockerd runs --ip-forward=false)
        for k, v in {**eng.env(), "POLAR_DOCKER_EGRESS_NETWORK": network, "POLAR_REDIS_URL": egress_hub["redis_url"],
                     "POLAR_API_URL": egress_hub["api_url"]}.items():
            monkeypatch.setenv(k, v)
        targets = _egress_targets(egress_hub)
        sess = gateway.new_session()
        rt = DockerRuntime(eng.client())
        handle = rt.start(RuntimeSpec(backend="docker", image=eng.image, allow_internet=True), tmp_path / "s",
                          "egress-docker")
        handle = handle.updated(gateway_urls=list(sess["base_urls"].values()))
        assert handle.network == network and rt.bridges_gateway(handle)
        log = tmp_path / "probe.log"
        env = {"OPENAI_BASE_URL": sandbox_urls(sess["base_urls"])["openai"], "PROBE_TARGETS": json.dumps(targets)}
        res = rt.exec(handle, [sys.executable, str(EGRESS_PROBE)], timeout=90, log_path=log, env=env)
        assert res.exit_code == 0, res.output_tail
        _assert_egress(_probe_result(log))
        egress.remove_docker_rules(bridge)  # the control
        rt.exec(handle, [sys.executable, str(EGRESS_PROBE)], timeout=90, log_path=log, env=env)
        assert _probe_result(log)["redis_host"].startswith("CONNECTED"), _probe_result(log)
    finally:
        forward.write_text(was + "\n")
        if handle is not None:
            rt.stop(handle)
        egress.remove_docker_rules(bridge)
        try:
            eng.client().networks.get(network).remove()
        except Exception:  # noqa: BLE001 - the engine goes next anyway
            pass
        eng.stop()


@pytest.mark.full
def test_a_session_with_internet_reaches_the_outside_but_not_the_hub(egress_hub, gateway, tmp_path):
    """The same through the stages: a task with allow_internet under bwrap, run by real pools;
    the harness is handed the forwarded gateway URLs (stages.py, bridges_gateway)."""
    from tests.support.pipeline import agent_task, make_pipeline

    targets = _egress_targets(egress_hub)
    p = make_pipeline(gateway, tmp_path, POLAR_API_URL=egress_hub["api_url"])
    try:
        for stage in ("init", "run", "postrun"):
            p.start_worker(stage, 1)
        _, sids = p.submit(agent_task(num_samples=1, runtime={
            "backend": "bwrap", "allow_internet": True, "keep_workdir": True,
            "env": {"PROBE_TARGETS": json.dumps(targets), "PROBE_OUT": "probe.json"}},
            agent={"harness": "shell", "model": "policy",
                   "options": {"command": [sys.executable, str(EGRESS_PROBE)]}}))
        [rec] = p.wait(sids, timeout=120)
        assert rec.state == "COMPLETED", rec.error
        _assert_egress(json.loads(Path(rec.runtime.workdir, "probe.json").read_text()))
    finally:
        p.stop()
