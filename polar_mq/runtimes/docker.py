"""`docker` runtime: one container per session, driven through the docker SDK (``pip install docker``).

Lifecycle
* ``start`` creates ``polar-<session id>`` from ``runtime.image``, labelled
  ``polar_mq.session=<session id>``, whose PID 1 is a tiny shell loop that only sleeps and reaps.
  The session dir (work dir, HOME, logs) is bind-mounted at its own host path, so the paths a
  harness config names are the same inside and out; the harness cache (``$POLAR_HARNESS_DIR``) is
  mounted read-only at its host path so the installed CLIs can run (the image needs ``node`` for
  them, or see ``POLAR_DOCKER_MOUNTS``). Limits: ``cpus`` → nano_cpus, ``memory_mb`` → memory (no
  extra swap), ``gpus`` → a device request, pids limit ``$POLAR_DOCKER_PIDS_LIMIT`` (4096).
* ``exec`` runs a command with ``docker exec`` (SDK low level), streaming its output into the log
  file. On timeout or stop every process in the container except PID 1 is killed *inside* the
  container (``kill -TERM -1``, then ``-KILL``), so the output so far stays in the log. A
  finished command's leftovers are killed the same way.
* ``reap`` (takeover after a dead run worker) kills what the dead attempt left inside the
  container (restarting the container if it stopped); ``stop`` removes it (idempotent).
* ``sweep(store)`` removes containers labelled with a session that is terminal (or unknown to
  this Redis for over ``$POLAR_DOCKER_ORPHAN_AGE`` s, default 3600): the janitor runs it every
  ``$POLAR_DOCKER_SWEEP_INTERVAL`` s (30) so a session whose postrun never ran its teardown
  never leaks a container.

Network
* ``allow_internet: true`` → the egress bridge network (``POLAR_DOCKER_EGRESS_NETWORK``, default
  ``polar-egress``, created on first use), never the host network: the container's loopback is its
  own, and where the worker is root with iptables the hub's addresses, the worker host's and
  169.254.0.0/16 are rejected for that bridge (runtimes/egress.py). The gateway is bridged in as
  below. ``POLAR_SANDBOX_HOST_NETWORK=1`` (the operator's opt-out) restores host networking.
* ``allow_internet: false`` (default) → ``network_mode=none`` (loopback only), plus a bridge: for
  each loopback gateway endpoint the worker opens a listener on the same ``127.0.0.1:PORT``
  *inside the container's network namespace* (setns from a worker thread) and relays its
  connections to the gateway. The harness reaches the gateway at its usual URL and nothing else.
  This needs the worker to run as root on the docker host (CAP_SYS_ADMIN for setns); without it,
  the run fails with a message saying to run as root. A
  gateway on another host listens on ``127.0.0.1:PORT`` inside and is relayed to that host
  (netbridge.sandbox_forwards); the harness gets the loopback URLs.

``POLAR_DOCKER_MOUNTS``: extra host paths to bind into every container, comma separated,
``SRC[:DST][:ro|rw]`` (read-only by default) — e.g. ``/usr,/lib,/lib64,/bin,/sbin`` over a tiny
rootfs image shares the host's toolchain (python, node) with the container, as the tests do.
The docker engine is found the SDK's way (``DOCKER_HOST``, else /var/run/docker.sock).
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import re
import tarfile
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

from polar_mq.runtimes.logcap import RotatingLog
from polar_mq.model import RuntimeHandle
from polar_mq.settings import DockerSettings
from polar_mq.taskspec import RuntimeSpec
from polar_mq.runtimes.base import ExecResult, OnStart, tail

log = logging.getLogger("polar_mq.runtimes.docker")

LABEL = "polar_mq.session"
TASK_LABEL = "polar_mq.task"
# PID 1: sleep forever, reap orphans (the shell's wait reaps any child), exit on TERM.
INIT = ["sh", "-c", "trap 'exit 0' TERM INT; while :; do sleep 3600 & wait $!; done"]
KILL_ALL = "kill -TERM -1 2>/dev/null; sleep {grace}; kill -KILL -1 2>/dev/null; true"


def container_name(session_id: str) -> str:
    return "polar-" + re.sub(r"[^a-zA-Z0-9_.-]", "-", session_id)[:120]


def parse_mounts(spec: str | None) -> dict[str, dict[str, str]]:
    """``SRC[:DST][:ro|rw],...`` → the SDK's volumes dict (read-only unless ``:rw``)."""
    volumes: dict[str, dict[str, str]] = {}
    for item in (spec or "").split(","):
        item = item.strip()
        if not item:
            continue
        parts = item.split(":")
        mode = "ro"
        if parts[-1] in ("ro", "rw") and len(parts) > 1:
            mode = parts.pop()
        src = parts[0]
        dst = parts[1] if len(parts) > 1 else src
        if os.path.exists(src):
            volumes[src] = {"bind": dst, "mode": mode}
    return volumes


def docker_client(timeout: int = 60):
    import docker  # optional dependency: pip install docker

    return docker.from_env(timeout=timeout)


class DockerRuntime:
    backend = "docker"

    def __init__(self, client=None):
        self._client = client

    @property
    def client(self):
        if self._client is None:
            self._client = docker_client()
        return self._client

    # ---- lifecycle ------------------------------------------------------------------------------
    def start(self, spec: RuntimeSpec, session_dir: Path, session_id: str) -> RuntimeHandle:
        from docker.errors import NotFound
        from docker.types import DeviceRequest

        if not spec.image:
            raise ValueError("runtime.image is required for the docker backend")
        sdir = Path(session_dir).resolve()
        work, home = sdir / "work", sdir / "home"
        for d in (work, home, sdir / "logs"):
            d.mkdir(parents=True, exist_ok=True)
            os.chmod(d, 0o777)  # the image's user may not be the worker's
        name = container_name(session_id)
        try:  # an earlier init attempt's container (takeover): start clean
            self.client.containers.get(name).remove(force=True)
        except NotFound:
            pass
        volumes = {str(sdir): {"bind": str(sdir), "mode": "rw"}}
        from polar_mq.harnesses.install import default_cache_dir

        cache = default_cache_dir()  # created now: a CLI installed later at run time shows up
        try:
            cache.mkdir(parents=True, exist_ok=True)
            volumes[str(cache.resolve())] = {"bind": str(cache.resolve()), "mode": "ro"}
        except OSError:
            pass
        volumes.update(parse_mounts(DockerSettings.from_env().mounts))
        kwargs: dict[str, Any] = {
            "name": name, "command": INIT, "entrypoint": [], "detach": True,
            "labels": {LABEL: session_id, "polar_mq": "1"},
            "environment": dict(spec.env), "volumes": volumes,
            "network_mode": self._network(spec),
            "pids_limit": DockerSettings.from_env().pids_limit,
        }
        if spec.workdir:
            kwargs["working_dir"] = spec.workdir
        if spec.memory_mb:
            kwargs["mem_limit"] = f"{int(spec.memory_mb)}m"
            kwargs["memswap_limit"] = f"{int(spec.memory_mb)}m"
        if spec.cpus:
            kwargs["nano_cpus"] = int(float(spec.cpus) * 1e9)
        if spec.gpus:
            kwargs["device_requests"] = [DeviceRequest(count=int(spec.gpus), capabilities=[["gpu"]])]
        container = self.client.containers.run(spec.image, **kwargs)
        cwd = spec.workdir or str(work)
        handle = RuntimeHandle(backend=self.backend, container=name, container_id=container.id,
                               session_dir=str(sdir), workdir=cwd, host_workdir=str(work), home=str(home),
                               env=dict(spec.env), network=kwargs["network_mode"])
        if spec.workdir:
            self._run(handle, ["mkdir", "-p", spec.workdir])
        return handle

    def _network(self, spec: RuntimeSpec) -> str:
        """none, or for allow_internet the egress bridge (its blocks installed: egress.py)."""
        from polar_mq.runtimes import egress

        if not spec.allow_internet:
            return "none"
        if egress.host_network_allowed():
            return "host"
        name = egress.docker_network(self.client)
        why = egress.enforce_docker(egress.bridge_ifname(name), egress.blocked_networks())
        if why:
            log.warning("docker allow_internet: %s (docs/security.md, 'Sandbox egress')", why)
        return name

    def _container(self, handle: RuntimeHandle):
        return self.client.containers.get(handle.container_id or handle.container)

    def _run(self, handle: RuntimeHandle, argv: list[str]) -> tuple[int, bytes]:
        res = self._container(handle).exec_run(argv, user="0", workdir="/")
        return res.exit_code, res.output

    def kill_all(self, handle: RuntimeHandle, grace: float = 1.0) -> None:
        """Kill every process in the container except PID 1 (inside the container)."""
        try:
            self._run(handle, ["sh", "-c", KILL_ALL.format(grace=grace)])
        except Exception as exc:  # noqa: BLE001 - the container may be gone already
            log.debug("kill_all on %s: %s", handle.container, exc)

    def exec(self, handle: RuntimeHandle, command: str | list[str], *, env: dict[str, str],
             timeout: float | None, log_path: Path, should_stop: Callable[[], bool] | None = None,
             on_start: OnStart | None = None, heartbeat: Callable[[], None] | None = None) -> ExecResult:
        from docker.errors import NotFound

        argv = ["sh", "-c", command] if isinstance(command, str) else list(command)
        container = self._container(handle)
        api = self.client.api
        bridge = self._bridge(handle, container)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        try:
            full_env = {"LANG": "C.UTF-8", **handle.env, **env}
            full_env.setdefault("HOME", handle.home)
            exec_id = api.exec_create(container.id, argv, environment=full_env, workdir=handle.workdir,
                                      stdout=True, stderr=True, stdin=False, tty=False)["Id"]
            stream = api.exec_start(exec_id, stream=True, demux=False)
            with contextlib.closing(RotatingLog(log_path)) as logf:  # size-capped (logcap.py)
                def pump() -> None:
                    try:
                        for chunk in stream:
                            logf.write(chunk)
                    except Exception:  # noqa: BLE001 - the stream ends when the container goes
                        pass

                pumper = threading.Thread(target=pump, daemon=True)
                pumper.start()
                if on_start:
                    on_start({"exec_id": exec_id})
                timed_out = stopped = False
                last_beat = 0.0
                gone = False
                while True:
                    pumper.join(0.2)
                    try:
                        info = api.exec_inspect(exec_id)
                    except NotFound:  # the container was removed under us (cancel, teardown)
                        gone = True
                        break
                    if not info.get("Running"):
                        break
                    elapsed = time.monotonic() - t0
                    if timeout is not None and elapsed >= timeout:
                        timed_out = True
                    elif should_stop is not None and should_stop():
                        stopped = True
                    if timed_out or stopped:
                        self.kill_all(handle)
                        break
                    if heartbeat and elapsed - last_beat >= 1.0:
                        heartbeat()
                        last_beat = elapsed
                exit_code = None
                if not gone:
                    self.kill_all(handle, grace=0.2)  # leftovers of a finished command
                    pumper.join(5)
                    try:
                        exit_code = api.exec_inspect(exec_id).get("ExitCode")
                    except NotFound:
                        pass
        finally:
            if bridge is not None:
                bridge.close()
        return ExecResult(exit_code=exit_code, timed_out=timed_out, stopped=stopped,
                          duration_s=time.monotonic() - t0, output_tail=tail(log_path),
                          log_path=str(log_path))

    def bridges_gateway(self, handle: RuntimeHandle) -> bool:
        """True unless the container has the host network: the harness gets the forwarded URLs."""
        return handle.network != "host"

    def _bridge(self, handle: RuntimeHandle, container):
        if handle.network == "host":
            return None
        from polar_mq.runtimes.netbridge import NetnsBridge, sandbox_forwards
        from polar_mq.runtimes.session_guard import SessionGuard, key_from_urls

        local = sandbox_forwards(handle.gateway_urls)  # remote gateways too
        if not local:
            return None
        container.reload()
        pid = container.attrs["State"]["Pid"]
        key = key_from_urls(handle.gateway_urls)
        try:
            return NetnsBridge(pid, local, SessionGuard(key) if key else None)
        except OSError as exc:
            raise RuntimeError(
                f"cannot bridge the gateway into the container's private network ({exc}); run the "
                f"worker as root on the docker host") from exc

    # ---- files ----------------------------------------------------------------------------------
    def _abs(self, handle: RuntimeHandle, path: str) -> str:
        return path if path.startswith("/") else os.path.join(handle.workdir, path)

    def upload(self, handle: RuntimeHandle, src: Path, dst: str) -> None:
        target = self._abs(handle, dst)
        parent, base = os.path.split(target.rstrip("/"))
        self._run(handle, ["mkdir", "-p", parent])
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            tar.add(str(src), arcname=base)
        if not self._container(handle).put_archive(parent, buf.getvalue()):
            raise RuntimeError(f"upload of {src} to {target} failed")

    def download(self, handle: RuntimeHandle, src: str, dst: Path) -> None:
        source = self._abs(handle, src)
        bits, _ = self._container(handle).get_archive(source)
        with tempfile.TemporaryDirectory() as tmp:
            with tempfile.TemporaryFile() as fh:
                for chunk in bits:
                    fh.write(chunk)
                fh.seek(0)
                with tarfile.open(fileobj=fh) as tar:
                    tar.extractall(tmp)
            got = Path(tmp) / os.path.basename(source.rstrip("/"))
            dst = Path(dst)
            dst.parent.mkdir(parents=True, exist_ok=True)
            if got.is_dir():
                import shutil

                shutil.copytree(got, dst, dirs_exist_ok=True)
            else:
                os.replace(got, dst)

    # ---- teardown -------------------------------------------------------------------------------
    def reap(self, handle: RuntimeHandle | None) -> None:
        from docker.errors import NotFound

        if not handle:
            return
        try:
            container = self._container(handle)
        except NotFound:
            return
        if container.status != "running":
            container.start()
        else:
            self.kill_all(handle, grace=0.5)

    def stop(self, handle: RuntimeHandle | None) -> None:
        from docker.errors import APIError, NotFound

        if not handle:
            return
        try:
            self._container(handle).remove(force=True)
        except NotFound:
            pass
        except APIError as exc:  # removal already in progress
            if "in progress" not in str(exc):
                raise


def sweep(store, client=None) -> list[str]:
    """Remove containers of sessions that are terminal or unknown to `store`; returns their names."""
    from polar_mq import states

    client = client or docker_client(timeout=10)
    removed = []
    orphan_age = DockerSettings.from_env().orphan_age
    for c in client.containers.list(all=True, filters={"label": LABEL}):
        sid = c.labels.get(LABEL)
        rec = store.get_session(sid) if sid else None
        if rec is not None and not states.is_terminal(rec.state):
            continue
        if rec is None and _age(c) < orphan_age:
            continue  # unknown here: maybe another deployment's (same engine, other Redis)
        try:
            c.remove(force=True)
            removed.append(c.name)
        except Exception as exc:  # noqa: BLE001
            log.debug("sweep: cannot remove %s: %s", c.name, exc)
    if removed:
        log.warning("removed %d orphaned session container(s): %s", len(removed), ", ".join(removed))
    return removed


def _age(container) -> float:
    from datetime import datetime

    created = container.attrs.get("Created", "")
    try:
        ts = datetime.fromisoformat(created[:26].rstrip("Z") + "+00:00").timestamp()
    except ValueError:
        return 0.0
    return time.time() - ts


_last_sweep = [0.0]


def maybe_sweep(store, interval: float | None = None) -> list[str]:
    """The janitor's hook: sweep at most every `interval` seconds ($POLAR_DOCKER_SWEEP_INTERVAL,
    default 30; 0 disables), and only where a docker engine is configured."""
    if interval is None:
        interval = DockerSettings.from_env().sweep_interval
    if interval <= 0 or time.time() - _last_sweep[0] < interval:
        return []
    return sweep_now(store)


def sweep_now(store) -> list[str]:
    """Sweep now (a worker starting: what a dead worker left), where a docker engine is configured."""
    _last_sweep[0] = time.time()
    if not DockerSettings.from_env().engine_configured():
        return []
    try:
        return sweep(store)
    except Exception as exc:  # noqa: BLE001 - no engine, no SDK: nothing to sweep
        log.debug("docker sweep skipped: %s", exc)
        return []
