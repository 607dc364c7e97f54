"""The docker runtime against a real Docker engine (started by the fixture, see docker_support).

Skipped, with the reason, where dockerd cannot start (not installed, not root, no SDK)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from tests.support.docker_engine import running_engine
from tests.support.pipeline import TINY_AGENT, agent_task, make_pipeline
from polar_mq import states
from polar_mq.runtimes.docker import LABEL, DockerRuntime, container_name, sweep
from polar_mq.taskspec import RuntimeSpec


@pytest.fixture(scope="module")
def engine(monkeypatch_module):
    for eng in running_engine():
        for k, v in eng.env().items():
            monkeypatch_module.setenv(k, v)
        yield eng


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


def processes(rt: DockerRuntime, handle) -> list[str]:
    """Command lines of the processes in the container other than PID 1 and this probe."""
    code, out = rt._run(handle, ["sh", "-c", "for p in /proc/[0-9]*; do [ ${p#/proc/} = 1 ] || "
                                             "[ ${p#/proc/} = $$ ] || tr '\\0' ' ' < $p/cmdline; echo; done"])
    return [ln for ln in out.decode().splitlines()
            if ln.strip() and "/proc/[0-9]" not in ln and ln.strip() != "sleep 3600"]  # init's sleep


def test_container_lifecycle_limits_files_and_timeout(engine, gateway, tmp_path):
    rt = DockerRuntime(engine.client())
    spec = RuntimeSpec(backend="docker", image=engine.image, env={"FOO": "bar"}, cpus=0.5, memory_mb=256)
    handle = rt.start(spec, tmp_path / "s", "sess-life")
    try:
        c = engine.client().containers.get(handle.container)
        assert c.labels[LABEL] == "sess-life" and c.status == "running"
        hc = c.attrs["HostConfig"]
        assert hc["Memory"] == 256 * 2**20 and hc["NanoCpus"] == 500_000_000
        assert hc["NetworkMode"] == "none" and hc["PidsLimit"] == 4096

        # exec: env, cwd = the session work dir (bind-mounted at its host path), python works
        log = tmp_path / "s" / "logs" / "a.log"
        r = rt.exec(handle, 'echo "$FOO $(pwd)"; python3 -c "print(6*7)" || '
                    f'{sys.executable} -c "print(6*7)"; echo hi > out.txt',
                    env={}, timeout=30, log_path=log)
        assert r.exit_code == 0 and not r.timed_out, log.read_text()
        assert f"bar {handle.workdir}" in log.read_text() and "42" in log.read_text()
        assert (tmp_path / "s" / "work" / "out.txt").read_text() == "hi\n"

        # no network, except the gateway bridged onto the container's own loopback
        probe = ("import urllib.request,sys\n"
                 "print(urllib.request.urlopen(sys.argv[1] + '/s/x', timeout=5).status)\n")
        r = rt.exec(handle, [sys.executable, "-c", probe, gateway.url], env={}, timeout=30,
                    log_path=tmp_path / "s" / "logs" / "nobridge.log")
        assert r.exit_code != 0  # no gateway_urls: nothing bridged
        bridged = handle.updated(gateway_urls=[gateway.url + "/s/x"])
        r = rt.exec(bridged, [sys.executable, "-c", probe, gateway.url], env={}, timeout=30,
                    log_path=tmp_path / "s" / "logs" / "bridge.log")
        assert r.exit_code == 0 and "200" in r.output_tail, r.output_tail
        r = rt.exec(bridged, [sys.executable, "-c", "import socket; socket.create_connection(('1.1.1.1', 80), 3)"],
                    env={}, timeout=30, log_path=tmp_path / "s" / "logs" / "net.log")
        assert r.exit_code != 0 and "unreachable" in r.output_tail.lower()

        # upload / download
        src = tmp_path / "up"
        (src / "d").mkdir(parents=True)
        (src / "d" / "f.txt").write_text("payload")
        rt.upload(handle, src / "d", "/opt/data")
        rt.upload(handle, src / "d" / "f.txt", "rel/g.txt")
        rt.download(handle, "/opt/data/f.txt", tmp_path / "back.txt")
        assert (tmp_path / "back.txt").read_text() == "payload"
        assert (tmp_path / "s" / "work" / "rel" / "g.txt").read_text() == "payload"

        # timeout: the process tree is killed inside the container, output so far kept
        t0 = time.time()
        r = rt.exec(handle, "echo before; (sleep 300 &); sleep 300; echo after", env={}, timeout=2,
                    log_path=tmp_path / "s" / "logs" / "t.log")
        assert r.timed_out and time.time() - t0 < 15
        assert "before" in r.output_tail and "after" not in r.output_tail
        assert c.reload() or c.status == "running"
        assert processes(rt, handle) == []
    finally:
        rt.stop(handle)
        rt.stop(handle)  # idempotent
    assert engine.containers() == []


def test_sweep_removes_containers_of_terminal_sessions(engine, tmp_path):
    rt = DockerRuntime(engine.client())
    spec = RuntimeSpec(backend="docker", image=engine.image)
    h_done = rt.start(spec, tmp_path / "a", "sess-done")
    h_live = rt.start(spec, tmp_path / "b", "sess-live")

    class Rec:
        def __init__(self, state):
            self.state = state

    class Store:
        def get_session(self, sid):
            return {"sess-done": Rec(states.COMPLETED), "sess-live": Rec(states.RUNNING)}.get(sid)

    try:
        removed = sweep(Store(), engine.client())
        assert removed == [container_name("sess-done")]
        assert [c.name for c in engine.containers()] == [container_name("sess-live")]
    finally:
        rt.stop(h_done)
        rt.stop(h_live)


# A harness that notes its start, runs the tiny agent through the gateway, lingers, notes the end:
# a killed attempt leaves a start without an end. The first attempt lingers long: a container's
# processes outlive the worker, so only the takeover's reap can stop it from ending.
SLOW_AGENT = (f'if [ -e ../marks ]; then S=1; else S=90; fi; echo "start $$" >> ../marks; '
              f'{sys.executable} {TINY_AGENT}; sleep $S; echo "end $$" >> ../marks')


def docker_task(engine, **overrides):
    return agent_task(runtime={"backend": "docker", "image": engine.image, "memory_mb": 1024}, **overrides)


def wait_state(p, sids, wanted, timeout=60.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        hit = [r for r in p.store.get_sessions(sids) if r.state in wanted]
        if hit:
            return hit
        time.sleep(0.1)
    raise AssertionError(f"no session reached {wanted}: {[r.state for r in p.store.get_sessions(sids)]}")


def test_session_in_container_survives_run_worker_kill(engine, gateway, tmp_path):
    p = make_pipeline(gateway, tmp_path, **engine.env())
    try:
        p.start_worker("init", 1)
        victim = p.start_worker("run", 1)
        p.start_worker("postrun", 1)
        _, [sid] = p.submit(docker_task(engine, num_samples=1,
                                        agent={"harness": "shell", "options": {"command": SLOW_AGENT}}))
        [rec] = wait_state(p, [sid], {states.RUNNING})
        name = rec.runtime.container
        marks = Path(rec.runtime.session_dir) / "marks"
        deadline = time.time() + 30
        while not (marks.exists() and "start" in marks.read_text()):
            assert time.time() < deadline, "harness never started in the container"
            time.sleep(0.1)
        time.sleep(1.0)
        assert engine.client().containers.get(name).status == "running"
        p.kill_worker(victim)  # the harness keeps running inside the container: reaped on takeover
        p.start_worker("run", 1)
        [rec] = p.wait([sid], timeout=120)
        assert rec.state == states.COMPLETED, (rec.state, rec.error)
        assert rec.stats["run_attempts"] == 2
        lines = [ln for ln in (Path(rec.runtime.session_dir) / "marks").read_text().splitlines() if ln]
        assert [ln.split()[0] for ln in lines] == ["start", "start", "end"], lines  # killed attempt never ended
        assert Path(rec.runtime.host_workdir, "polar.txt").read_text() == "hello from polar"
        traj = p.store.get_trajectory(sid)
        assert traj.status == "COMPLETED" and traj.stats["calls"] == 2 and traj.stats["traces"] == 1
        assert engine.containers() == []  # removed by postrun: nothing leaked
    finally:
        p.stop()


def test_harness_timeout_in_container(engine, gateway, tmp_path):
    p = make_pipeline(gateway, tmp_path, **engine.env())
    try:
        p.start_worker("init", 1)
        p.start_worker("run", 1)
        p.start_worker("postrun", 1)
        script = (f'echo started; {sys.executable} {TINY_AGENT}; echo agent-done; sleep 120 & sleep 120; '
                  f'echo never')
        _, [sid] = p.submit(docker_task(engine, num_samples=1, timeout_seconds=18,
                                        agent={"harness": "shell", "options": {"command": script}}))
        [rec] = wait_state(p, [sid], {states.RUNNING})
        name = rec.runtime.container
        [rec] = p.wait([sid], timeout=90)
        assert rec.state == states.TIMEOUT, (rec.state, rec.error)
        traj = p.store.get_trajectory(sid)
        assert traj.status == "TIMEOUT" and traj.stats["calls"] == 2 and traj.stats["traces"] == 1
        log = Path(rec.runtime.session_dir, "logs", f"harness-{rec.attempt}.log").read_text()
        assert "started" in log and "agent-done" in log and "never" not in log
        assert name not in [c.name for c in engine.containers()]
    finally:
        p.stop()


@pytest.mark.cli
def test_real_cli_in_container(engine, gateway, tmp_path):
    """pi (from the harness cache, mounted read-only) runs in a container without a network and
    reaches the gateway through the bridge."""
    from polar_mq.harnesses import install

    if not install.npm_available():
        pytest.skip("node/npm not on PATH")
    try:
        install.install(["pi"], timeout=600)
    except install.InstallError as exc:
        pytest.skip(f"could not install pi: {exc}")
    p = make_pipeline(gateway, tmp_path, **engine.env())
    try:
        p.start_worker("init", 1)
        p.start_worker("run", 1)
        p.start_worker("postrun", 1)
        _, [sid] = p.submit(docker_task(engine, num_samples=1, timeout_seconds=90,
                                        instruction="Create the file polar.txt polar:path=polar.txt",
                                        agent={"harness": "pi", "model": "stand-in"}))
        [rec] = p.wait([sid], timeout=120)
        log = Path(rec.runtime.session_dir, "logs", "harness-0.log").read_text(errors="replace")
        assert rec.state == states.COMPLETED, (rec.state, rec.error, log[-2000:])
        assert Path(rec.runtime.host_workdir, "polar.txt").read_text() == "hello from polar"
        traj = p.store.get_trajectory(sid)
        assert traj.stats["calls"] >= 2 and [t.metadata.get("role") for t in traj.traces].count("main") == 1
        assert engine.containers() == []
    finally:
        p.stop()


def test_create_arguments_without_an_engine(tmp_path, monkeypatch):
    """What start asks the engine for (no engine needed): limits, GPUs, network, mounts, labels."""
    pytest.importorskip("docker")
    from types import SimpleNamespace

    seen = {}

    made = SimpleNamespace(id="cid", exec_run=lambda argv, **k: seen.setdefault("execs", []).append(argv)
                           or SimpleNamespace(exit_code=0, output=b""))

    class Containers:
        def get(self, name):
            from docker.errors import NotFound
            if name == "cid":
                return made
            raise NotFound("none")

        def run(self, image, **kw):
            seen.update(image=image, **kw)
            return made

    monkeypatch.setenv("POLAR_DOCKER_MOUNTS", f"{tmp_path}:/data:rw,/nonexistent")
    monkeypatch.setenv("POLAR_SANDBOX_HOST_NETWORK", "1")  # the operator's opt-out: allow_internet = host
    rt = DockerRuntime(SimpleNamespace(containers=Containers()))
    spec = RuntimeSpec(backend="docker", image="img", gpus=2, cpus=1.5, memory_mb=100, allow_internet=True,
                       workdir="/testbed")
    h = rt.start(spec, tmp_path / "s", "t-1")
    assert seen["image"] == "img" and seen["network_mode"] == "host"
    [req] = seen["device_requests"]
    assert req["Count"] == 2 and req["Capabilities"] == [["gpu"]]
    assert seen["nano_cpus"] == 1_500_000_000 and seen["mem_limit"] == "100m"
    assert seen["labels"][LABEL] == "t-1" and seen["working_dir"] == "/testbed"
    sdir = str((tmp_path / "s").resolve())
    assert seen["volumes"][sdir] == {"bind": sdir, "mode": "rw"}
    assert seen["volumes"][str(tmp_path)] == {"bind": "/data", "mode": "rw"}
    assert "/nonexistent" not in seen["volumes"]
    assert h.workdir == "/testbed" and h.host_workdir == f"{sdir}/work" and h.network == "host"
    assert seen["execs"] == [["mkdir", "-p", "/testbed"]]


def test_the_worker_preloads_the_docker_sdk():
    """The worker module imports the docker SDK whole in its main thread (runtimes.preload_docker_sdk),
    before the threads pool runs stages: two stage threads importing it first at the same time saw
    a partially initialised `docker.types` (ImportError in an init stage)."""
    import subprocess

    code = ("import sys; import polar_mq.tasks.worker.main; "
            "print(all(m in sys.modules for m in ('docker', 'docker.types', 'docker.errors')))")
    env = {**os.environ, "POLAR_REDIS_URL": "redis://127.0.0.1:1/0"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "True", out.stdout
