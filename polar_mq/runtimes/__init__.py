"""Runtimes: where a session's harness runs. `get_runtime(backend)` returns one by name.

A TaskRequest without `runtime.backend` gets ``auto``: the safest runtime this worker has
(`select_backend`): docker when the task names an image and an engine answers (else bwrap when the
image is a rootfs image directory built here: docs/swegym.md), else bwrap when bubblewrap works here. It fails closed (NoIsolation: the session ends ERROR with the reason):
never the local runtime, and never an image's task under bwrap on the host filesystem when no
docker engine answers (tests/trust/test_trust_auto.py). The choice is made once, by the init worker,
and kept in the session's runtime handle, so every later stage uses the same one.
"""

from __future__ import annotations

import functools
import logging
import shutil
import subprocess

from polar_mq.model import RuntimeHandle
from polar_mq._io.plugins import import_object
from polar_mq.taskspec import RuntimeSpec
from polar_mq.runtimes.base import ExecResult, Runtime

log = logging.getLogger("polar_mq.runtimes")

AUTO = "auto"
_FACTORIES = {
    "local": "polar_mq.runtimes.local:LocalRuntime",
    "bwrap": "polar_mq.runtimes.bwrap:BwrapRuntime",
    "docker": "polar_mq.runtimes.docker:DockerRuntime",
    "apptainer": "polar_mq.runtimes.apptainer:ApptainerRuntime",
}


class NoIsolation(RuntimeError):
    """`auto` found no runtime that isolates what the task asks for on this worker."""


def get_runtime(backend: str) -> Runtime:
    target = _FACTORIES.get(backend)
    if target is None:
        raise ValueError(f"runtime backend {backend!r} is not available here "
                         f"(available: {', '.join(sorted(_FACTORIES))})")
    return import_object(target)()


@functools.lru_cache(maxsize=1)
def bwrap_works() -> bool:
    """bubblewrap is installed and can make a sandbox here (user namespaces allowed)."""
    path = shutil.which("bwrap")
    if not path:
        return False
    try:
        return subprocess.run([path, "--unshare-all", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
                               "true"], capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def preload_docker_sdk() -> None:
    """Import the optional docker SDK whole, once, in the worker's main thread before its pool's
    threads start: two threads importing it for the first time at once can see a half-initialised
    `docker.types` (ImportError "partially initialized module", an init stage in the threads pool).
    tests/runtimes/test_runtimes_docker.py::test_the_worker_preloads_the_docker_sdk guards it."""
    try:
        import docker  # type: ignore[import-untyped]  # noqa: F401
        import docker.errors  # type: ignore[import-untyped]  # noqa: F401
        import docker.types  # type: ignore[import-untyped]  # noqa: F401
    except ImportError:  # no SDK: the docker runtime says so when it is asked for
        pass


def docker_works() -> bool:
    try:
        import docker  # type: ignore[import-untyped]

        client = docker.from_env(timeout=5)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except Exception:  # noqa: BLE001 - no SDK, no engine, no permission: not available
        return False


def _is_rootfs_image(image: str) -> bool:
    from polar_mq.runtimes.images.layout import resolve

    try:
        return resolve(image) is not None
    except ValueError:
        return False


def select_backend(image: str | None, session_id: str = "") -> str:
    """The safest backend available for a task (docker needs an image); NoIsolation when none."""
    if image:
        if docker_works():
            return "docker"
        if bwrap_works() and _is_rootfs_image(image):  # the image itself, as a directory (bwrap_rootfs.py)
            return "bwrap"
        raise NoIsolation(f"runtime auto: the task names image {image!r} but no docker engine answers on this "
                          f"worker; it is not run under bwrap on the host filesystem instead (start a docker "
                          f"engine here, build it as a rootfs image: polar-mq image build --backend bwrap, "
                          f"or name runtime.backend)")
    if bwrap_works():
        return "bwrap"
    raise NoIsolation("runtime auto: no isolation available on this worker (bubblewrap cannot make a sandbox "
                      "here: install it, apt-get install bubblewrap, and allow user namespaces; or give the "
                      "task an image for docker); the local runtime is never chosen by auto")


def resolve_backend(spec: RuntimeSpec, handle: RuntimeHandle | None = None, session_id: str = "") -> str:
    """The concrete backend of a task's runtime: as written, or for ``auto`` the one the session's
    handle records (chosen at init), else a fresh choice."""
    if spec.backend != AUTO:
        return spec.backend
    if handle is not None and handle.backend in _FACTORIES:
        return handle.backend
    return select_backend(spec.image, session_id)


__all__ = ["AUTO", "ExecResult", "NoIsolation", "Runtime", "get_runtime", "resolve_backend", "select_backend"]
