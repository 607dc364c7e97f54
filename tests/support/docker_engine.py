"""A private Docker engine for the tests, and an image made from a local rootfs.

dockerd is started with its own data/exec roots and socket and without touching host networking
(``--bridge=none --iptables=false ...``; containers use ``--network none`` or host networking).
No registry is reachable, so the image is imported from a tiny rootfs: empty top-level dirs, a
few files from the host's /etc, and the merged-/usr symlinks (bin → usr/bin ...). The runtime
then bind-mounts the host's /usr, the Python installation and the repository read-only
(``POLAR_DOCKER_MOUNTS``), so python and node work inside the container.
"""

from __future__ import annotations

import io
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
IMAGE = "polar-hostfs:test"
ETC_FILES = ("passwd", "group", "nsswitch.conf", "ld.so.cache", "ld.so.conf", "host.conf", "hosts")


@dataclass
class Engine:
    host: str  # unix:///.../docker.sock
    proc: subprocess.Popen
    base: Path
    image: str = IMAGE

    def client(self):
        import docker

        return docker.DockerClient(base_url=self.host, timeout=60)

    @property
    def mounts(self) -> str:
        paths = ["/usr", sys.base_prefix, sys.prefix, str(ROOT)]
        return ",".join(dict.fromkeys(p for p in paths if os.path.isdir(p)))

    def env(self) -> dict[str, str]:
        """What a worker needs to use this engine with the docker backend."""
        return {"DOCKER_HOST": self.host, "POLAR_DOCKER_MOUNTS": self.mounts}

    def containers(self, all: bool = True):
        return self.client().containers.list(all=all, filters={"label": "polar_mq.session"})

    def stop(self) -> None:
        try:
            for c in self.client().containers.list(all=True):
                c.remove(force=True)
        except Exception:
            pass
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        subprocess.run(["umount", "-R", str(self.base / "exec")], capture_output=True)
        shutil.rmtree(self.base, ignore_errors=True)


def rootfs_tar() -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        def add_dir(name: str, mode: int = 0o755) -> None:
            info = tarfile.TarInfo(name)
            info.type, info.mode = tarfile.DIRTYPE, mode
            tar.addfile(info)

        for d in ("usr", "etc", "root", "home", "proc", "sys", "dev", "run", "var", "opt", "work"):
            add_dir(d)
        add_dir("tmp", 0o1777)
        for link, target in (("bin", "usr/bin"), ("lib", "usr/lib"), ("lib64", "usr/lib64"),
                             ("sbin", "usr/sbin")):
            info = tarfile.TarInfo(link)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
        for name in ETC_FILES:
            src = Path("/etc") / name
            if src.is_file():
                tar.add(str(src), arcname=f"etc/{name}")
    return buf.getvalue()


def start_engine() -> tuple[Engine | None, str]:
    """(engine, "") or (None, why it cannot start)."""
    dockerd = shutil.which("dockerd")
    if dockerd is None:
        return None, "dockerd not installed (apt-get install docker.io)"
    if os.geteuid() != 0:
        return None, "dockerd needs root"
    try:
        import docker  # noqa: F401
    except ImportError:
        return None, "the docker SDK is not installed (pip install docker)"
    base = Path(tempfile.mkdtemp(prefix="pdk-"))  # short: socket paths are limited
    sock = base / "d.sock"
    log = open(base / "dockerd.log", "wb")
    proc = subprocess.Popen(
        [dockerd, "--data-root", str(base / "data"), "--exec-root", str(base / "exec"),
         "--pidfile", str(base / "d.pid"), "--host", f"unix://{sock}", "--bridge=none",
         "--iptables=false", "--ip6tables=false", "--ip-forward=false", "--ip-masq=false"],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    engine = Engine(host=f"unix://{sock}", proc=proc, base=base)
    deadline = time.time() + 30
    while time.time() < deadline:
        if proc.poll() is not None:
            why = (base / "dockerd.log").read_text(errors="replace")[-1500:]
            shutil.rmtree(base, ignore_errors=True)
            return None, f"dockerd exited with {proc.returncode}: {why}"
        try:
            engine.client().ping()
            break
        except Exception:
            time.sleep(0.2)
    else:
        engine.stop()
        return None, "dockerd did not answer within 30 s"
    try:
        engine.client().api.import_image_from_data(rootfs_tar(), repository=IMAGE.split(":")[0],
                                                   tag=IMAGE.split(":")[1])
    except Exception as exc:
        engine.stop()
        return None, f"cannot import the rootfs image: {exc}"
    return engine, ""


def running_engine():
    """A module fixture's body: a started engine, stopped after. No engine skips with the reason
    (a failure in CI, where .ci/run installs docker.io: tests/conftest.py, POLAR_REQUIRE_ALL)."""
    import pytest

    eng, why = start_engine()
    if eng is None:
        pytest.skip(f"no Docker engine: {why}")
    try:
        yield eng
    finally:
        eng.stop()
