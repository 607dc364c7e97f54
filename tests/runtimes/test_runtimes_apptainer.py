"""The apptainer runtime at the level of the commands it issues: Apptainer cannot be installed
on the machines this was built on, so no real instance is started here."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from polar_mq.runtimes import get_runtime
from polar_mq.runtimes.apptainer import ApptainerRuntime, instance_name
from polar_mq.runtimes.base import ExecResult
from polar_mq.taskspec import RuntimeSpec


class Recorder:
    def __init__(self):
        self.calls: list[list[str]] = []
        self.supervised: list[dict] = []

    def run(self, argv):
        self.calls.append(list(argv))
        return SimpleNamespace(returncode=0, stdout="", stderr="")

    def supervise(self, argv, **kw):
        self.supervised.append({"argv": list(argv), **kw})
        return ExecResult(exit_code=None, timed_out=True, output_tail="partial")


def test_instance_start_exec_stop_commands(tmp_path, monkeypatch):
    monkeypatch.setenv("POLAR_HARNESS_DIR", str(tmp_path / "cache"))
    (tmp_path / "cache").mkdir()
    rec = Recorder()
    rt = ApptainerRuntime(binary="apptainer", runner=rec.run, supervisor=rec.supervise)
    spec = RuntimeSpec(backend="apptainer", image="/images/task.sif", env={"A": "1"}, gpus=1, cpus=2,
                       memory_mb=512, workdir="/testbed")
    handle = rt.start(spec, tmp_path / "s", "sess/1")
    sdir = str((tmp_path / "s").resolve())
    name = instance_name("sess/1")
    assert name == "polar-sess-1"
    stop, start, mkdir = rec.calls
    assert stop == ["apptainer", "instance", "stop", name]
    assert start == ["apptainer", "instance", "start", "--containall", "--no-home", "--cleanenv", "--pid",
                     "--overlay", f"{sdir}/overlay", "--bind", f"{sdir}:{sdir}",
                     "--bind", f"{tmp_path / 'cache'}:{tmp_path / 'cache'}:ro",
                     "--nv", "--cpus", "2", "--memory", "512M", "/images/task.sif", name]
    assert mkdir == ["apptainer", "exec", f"instance://{name}", "mkdir", "-p", "/testbed"]
    assert handle.workdir == "/testbed" and handle.home == f"{sdir}/home"
    assert (tmp_path / "s" / "overlay").is_dir()

    rec.calls.clear()
    r = rt.exec(handle, ["claude", "-p", "hi"], env={"K": "v"}, timeout=5,
                log_path=tmp_path / "s" / "logs" / "h.log")
    assert r.timed_out and r.output_tail == "partial"
    [sup] = rec.supervised
    assert sup["argv"] == ["apptainer", "exec", "--cleanenv", "--pwd", "/testbed", f"instance://{name}",
                           "claude", "-p", "hi"]
    assert sup["env"]["APPTAINERENV_K"] == "v" and sup["env"]["APPTAINERENV_A"] == "1"
    assert sup["env"]["APPTAINERENV_HOME"] == f"{sdir}/home" and sup["timeout"] == 5
    # after the timeout everything left in the instance is killed inside it
    [kill] = rec.calls
    assert kill[:3] == ["apptainer", "exec", f"instance://{name}"] and "kill -KILL -1" in kill[-1]

    rec.calls.clear()
    rt.reap(handle.updated(pgid=None))
    rt.stop(handle)
    assert rec.calls[0][:3] == ["apptainer", "exec", f"instance://{name}"]
    assert rec.calls[1] == ["apptainer", "instance", "stop", name]


def test_no_gpu_no_limits_and_file_transfer(tmp_path):
    rec = Recorder()
    rt = ApptainerRuntime(binary="/opt/apptainer", runner=rec.run, supervisor=rec.supervise)
    handle = rt.start(RuntimeSpec(backend="apptainer", image="docker://x"), tmp_path / "s", "s2")
    start = rec.calls[1]
    assert start[0] == "/opt/apptainer" and "--nv" not in start and "--cpus" not in start
    assert "--net" not in start  # shares the host network so the gateway is reachable (documented)
    src = tmp_path / "f.txt"
    src.write_text("x")
    rt.upload(handle, src, "a/b.txt")
    assert Path(handle.workdir, "a", "b.txt").read_text() == "x"
    rt.upload(handle, src, "/etc/task.txt")  # outside the session dir: through the overlay
    assert (tmp_path / "s" / "overlay" / "upper" / "etc" / "task.txt").exists()
    rt.download(handle, "a/b.txt", tmp_path / "back.txt")
    assert (tmp_path / "back.txt").read_text() == "x"


def test_registry_has_every_backend():
    for name in ("local", "bwrap", "docker", "apptainer"):
        assert get_runtime(name).backend == name
