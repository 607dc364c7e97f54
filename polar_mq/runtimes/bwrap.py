"""`bwrap` runtime: a bubblewrap sandbox per command (the default where there is no container engine).

The sandbox sees the host's filesystem read-only (so the host's interpreters, node and the
installed harness CLIs work unchanged), a private /tmp, /dev and /proc, and exactly one writable
host directory: the session dir (work dir, HOME, logs), bound at its own path so every path a
harness config names is the same inside and out. It has its own PID namespace (everything in it
dies when the sandbox's init dies, and bwrap dies with the worker: ``--die-with-parent``), its
own IPC/UTS/cgroup namespaces, and its own network namespace unless ``allow_internet``. What the
read-only root would reveal about other sessions and the services (the token file's directory,
the other session dirs, results, spool, logs, /run with its unix sockets) is covered by empty
tmpfs mounts (``hidden_host_paths``).

Network: with a private network namespace the sandbox's loopback is its own, so a gateway on the
host's ``127.0.0.1:PORT`` would be out of reach. The sandbox command is therefore wrapped in
:mod:`polar_mq.runtimes.netbridge`, which listens on the same ``127.0.0.1:PORT`` inside and relays
to a unix socket (bound in from a short host temp dir) that the worker relays to the gateway,
through :mod:`polar_mq.runtimes.session_guard`: only this session's provider endpoints, one request
per connection. No privileges are needed. With ``allow_internet`` the sandbox keeps its own
network namespace and gets user-mode networking (slirp4netns) to the internet, with the hub's
addresses, this host's and 169.254.0.0/16 made unreachable inside it and no capabilities to undo
that (:mod:`polar_mq.runtimes.egress`); the gateway is bridged the same way as without internet.

``runtime.workdir`` (optional) is where the session's work dir appears inside (a bind of the
session's ``work`` dir); ``gpus`` binds the host's /dev. ``cpus``/``memory_mb`` are not enforced
by bubblewrap (it has no cgroup support); they are logged and ignored.

``runtime.image`` naming a rootfs image directory (``polar-mq image build --backend bwrap``) runs
the sandbox on that image's root filesystem instead of the host's (``bwrap_rootfs.py``); an image
name that is no such directory is an error, never the host's filesystem.

Tests: tests/runtimes/test_runtimes_bwrap.py, tests/trust/test_trust_sandbox.py.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

from polar_mq.model import RuntimeHandle
from polar_mq.taskspec import RuntimeSpec
from polar_mq.runtimes.base import ExecResult, OnStart
from polar_mq.runtimes.bwrap_rootfs import bridge_python, image_of, root_argv, start_in_image
from polar_mq.runtimes.local import LocalRuntime, base_env, kill_group, supervise
from polar_mq.runtimes import egress
from polar_mq.runtimes.netbridge import UnixRelay, sandbox_forwards
from polar_mq.runtimes.session_guard import SessionGuard, key_from_urls

log = logging.getLogger("polar_mq.runtimes.bwrap")

BRIDGE_DIR = "/tmp/.polar-gw"  # inside the sandbox (on its private /tmp)


def host_paths_under_tmp() -> list[str]:
    """Host paths the sandbox needs (the interpreter's prefix, the polar_mq checkout, the harness
    cache) that live under /tmp and would be hidden by the sandbox's private /tmp: they are
    bound back read-only. CI checkouts under /tmp are the usual case."""
    import polar_mq
    from polar_mq.harnesses.install import default_cache_dir

    candidates = {sys.prefix, sys.base_prefix, str(Path(polar_mq.__file__).resolve().parents[1]),
                  str(default_cache_dir())}
    under = sorted(p for p in candidates if p == "/tmp" or p.startswith("/tmp/"))
    # Drop paths already covered by a shorter one.
    return [p for p in under if not any(p != q and p.startswith(q + "/") for q in under)]


def hidden_host_paths() -> list[str]:
    """Host paths the read-only root would otherwise show the sandbox, each replaced by an empty
    tmpfs: the token file's directory, every session's dir (their harness configs hold their
    keys; the sandbox's own dir is bound back on top), results, the gateway's spool, `up`'s logs,
    and /run (the docker socket and other daemons' unix sockets, reachable without a network)."""
    import os

    from polar_mq.settings import GatewaySettings, PipelineSettings, polar_home

    pipeline = PipelineSettings.from_env()
    cache = Path.home() / ".cache" / "polar_mq"
    candidates = [str(polar_home()), pipeline.sessions_dir, pipeline.results_dir,
                  GatewaySettings.from_env().spool_dir or str(cache / "spool"), str(cache / "logs"),
                  str(cache / "sessions"), str(cache / "results"), "/run"]
    out: list[str] = []
    for path in candidates:
        real = os.path.realpath(path)
        if os.path.isdir(real) and real not in out and not real.startswith("/tmp/") and real != "/tmp":
            out.append(real)  # /tmp is private in the sandbox already
    return out


def bwrap_path() -> str | None:
    return shutil.which("bwrap")


class BwrapRuntime(LocalRuntime):
    backend = "bwrap"

    def bridges_gateway(self, handle: RuntimeHandle) -> bool:
        """True unless the sandbox shares the host network (the operator's POLAR_SANDBOX_HOST_NETWORK):
        the harness gets the forwarded (loopback) URLs, with or without internet."""
        return not self.shares_host_net(handle)

    @staticmethod
    def shares_host_net(handle: RuntimeHandle) -> bool:
        return bool(handle.allow_internet) and egress.host_network_allowed()

    def start(self, spec: RuntimeSpec, session_dir: Path, session_id: str) -> RuntimeHandle:
        if bwrap_path() is None:
            raise RuntimeError("the bwrap backend needs bubblewrap (apt-get install bubblewrap)")
        session_dir = Path(session_dir).resolve()
        image = image_of(spec)  # a rootfs image (bwrap_rootfs.py), else the host's filesystem
        handle = super().start(spec, session_dir, session_id)
        if spec.cpus or spec.memory_mb:
            log.warning("bwrap: cpus/memory_mb are not enforced by bubblewrap (session %s)", session_id)
        handle = handle.updated(backend=self.backend, cwd=spec.workdir or handle.workdir,
                                allow_internet=bool(spec.allow_internet), gpus=spec.gpus or 0)
        return start_in_image(image, spec, handle) if image is not None else handle

    def argv(self, handle: RuntimeHandle, command: list[str], bridges: list[tuple[str, int, str]],
             net_fds: tuple[int, int] | None = None, resolv: str | None = None) -> list[str]:
        """The bwrap command line for `command` (bridges: (host, port, host socket dir); net_fds:
        (info fd, block fd) of a sandbox that waits for its user-mode network, egress.SlirpNet)."""
        sdir = handle.session_dir
        argv = [bwrap_path() or "bwrap", "--die-with-parent", "--new-session", "--unshare-all"]
        if self.shares_host_net(handle):
            argv.append("--share-net")
        if net_fds is not None:  # no capability may remove the prohibit routes
            argv += ["--cap-drop", "ALL", "--info-fd", str(net_fds[0]), "--block-fd", str(net_fds[1])]
        in_image = root_argv(handle, BRIDGE_DIR)
        if in_image is not None:  # the image's rootfs: nothing of the host to hide
            argv += in_image
        else:
            argv += ["--ro-bind", "/", "/"]
            argv += ["--dev-bind", "/dev", "/dev"] if handle.gpus else ["--dev", "/dev"]
            argv += ["--proc", "/proc", "--tmpfs", "/tmp"]
            for path in host_paths_under_tmp():  # the private /tmp must not hide our interpreter
                argv += ["--ro-bind", path, path]
            for path in hidden_host_paths():  # tokens, other sessions' dirs and keys, daemons' sockets
                if path != sdir:
                    argv += ["--tmpfs", path]
            if resolv:  # slirp4netns's DNS, where the host's resolv.conf points (maybe under the hidden /run)
                argv += ["--ro-bind", resolv, os.path.realpath("/etc/resolv.conf")]
        argv += ["--bind", sdir, sdir]
        cwd = handle.cwd or handle.workdir
        if cwd != handle.workdir:
            argv += ["--bind", handle.workdir, cwd]
        if bridges:
            argv += ["--bind", bridges[0][2], BRIDGE_DIR]
        argv += ["--chdir", cwd, "--"]
        if bridges:
            argv += bridge_python(handle) or [sys.executable, "-m", "polar_mq.runtimes.netbridge"]
            for host, port, _ in bridges:
                argv += ["--listen", f"{host}:{port}={BRIDGE_DIR}/{port}.sock"]
            argv.append("--")
        return argv + command

    def exec(self, handle: RuntimeHandle, command: str | list[str], *, env: dict[str, str],
             timeout: float | None, log_path: Path, should_stop: Callable[[], bool] | None = None,
             on_start: OnStart | None = None, heartbeat: Callable[[], None] | None = None) -> ExecResult:
        cmd = ["bash", "-lc", command] if isinstance(command, str) else list(command)
        relays: list[UnixRelay] = []
        bridges: list[tuple[str, int, str]] = []
        tmp = None
        fds: list[int] = []
        slirp: list[egress.SlirpNet] = []
        try:
            if self.bridges_gateway(handle):
                # Loopback and remote gateways alike (netbridge.sandbox_forwards); only this
                # session's provider endpoints pass the bridge (session_guard).
                key = key_from_urls(handle.gateway_urls)
                guard = SessionGuard(key) if key else None
                for fw in sandbox_forwards(handle.gateway_urls):
                    if tmp is None:  # short path: unix socket paths are limited to 108 bytes
                        tmp = tempfile.mkdtemp(prefix="polar-gw-")
                    relays.append(UnixRelay(Path(tmp) / f"{fw.port}.sock", fw.target_host, fw.target_port,
                                            guard))
                    bridges.append((fw.listen_host, fw.port, tmp))
            net_fds = None
            resolv = None
            start = on_start
            if handle.allow_internet and not self.shares_host_net(handle):
                if egress.slirp_path() is None:
                    raise RuntimeError("runtime.allow_internet under bwrap needs slirp4netns (apt-get "
                                       "install slirp4netns); the host network is never shared "
                                       "unless the operator sets POLAR_SANDBOX_HOST_NETWORK=1")
                info_r, info_w = os.pipe()
                block_r, block_w = os.pipe()
                fds += [info_r, info_w, block_r, block_w]
                net_fds = (info_w, block_r)
                blocked = egress.blocked_networks(handle.gateway_urls)
                if tmp is None:
                    tmp = tempfile.mkdtemp(prefix="polar-gw-")
                resolv = os.path.join(tmp, "resolv.conf")
                with open(resolv, "w") as fh:
                    fh.write(f"nameserver {egress.SLIRP_DNS}\n")
                os.chmod(resolv, 0o644)

                def start(info: dict[str, Any]) -> None:
                    os.close(info_w)  # bwrap holds its ends now: EOF once it is gone
                    os.close(block_r)
                    fds.remove(info_w)
                    fds.remove(block_r)
                    slirp.append(egress.SlirpNet(egress.read_child_pid(info_r), blocked))
                    os.write(block_w, b"1")  # the network is ready: the command may start
                    if on_start:
                        on_start(info)
            return supervise(self.argv(handle, cmd, bridges, net_fds, resolv), cwd=handle.workdir,
                             env=base_env(handle, env), timeout=timeout, log_path=log_path,
                             should_stop=should_stop, on_start=start, heartbeat=heartbeat,
                             pass_fds=net_fds or ())
        finally:
            for net in slirp:
                net.close()
            for fd in fds:
                try:
                    os.close(fd)
                except OSError:
                    pass
            for r in relays:
                r.close()
            if tmp:
                shutil.rmtree(tmp, ignore_errors=True)

    def reap(self, handle: RuntimeHandle) -> None:
        # Killing bwrap's process group ends the sandbox's PID namespace and all in it.
        if handle.pgid:
            kill_group(int(handle.pgid), grace=0.5)
