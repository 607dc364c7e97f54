"""Harbor tasks (the format of Terminal-Bench 2, read by Polar, SkyRL, rLLM, NeMo Gym) as rows.

A Harbor task is a directory:

    task.toml              [metadata] (free form), [verifier] timeout_sec / env,
                           [agent] timeout_sec, [environment] build_timeout_sec, cpus, memory_mb,
                           docker_image (a prebuilt image instead of the Dockerfile), allow_internet
    instruction.md         the instruction given to the agent
    environment/Dockerfile the image the agent works in (its WORKDIR is the agent's work dir)
    tests/test.sh          run after the agent, writes /logs/verifier/reward.txt (one number) or
                           /logs/verifier/reward.json ({"name": number, ...})
    solution/              optional, never given to the agent

`load_rows(DIR)` takes a task directory or a directory of them. Each task's environment image is
built here with the local Docker engine (tagged by the content of environment/, so an unchanged
task is not rebuilt); nothing is pulled: a `FROM` image the engine does not have is a row error
naming it. The row is a TaskRequest fragment: instruction, timeout (agent.timeout_sec), runtime
(docker, the built image, its WORKDIR, cpus/memory), grader `harbor` with the task dir, metadata;
the template gives the agent. Guarded by tests/graders/test_harbor.py.
"""

from __future__ import annotations

import hashlib
import re
import tomllib
from pathlib import Path
from typing import Any

from polar_mq.rl.datasets.readers import DatasetError
from polar_mq.rl.datasets.readers import Row

IMAGE_REPO = "polar-harbor"


def is_task_dir(path: Path) -> bool:
    return (path / "task.toml").is_file() and (path / "instruction.md").is_file()


def is_harbor(path: str | Path) -> bool:
    """A Harbor task directory, or a directory holding at least one."""
    p = Path(path)
    return p.is_dir() and (is_task_dir(p) or any(is_task_dir(c) for c in p.iterdir() if c.is_dir()))


def task_dirs(path: str | Path) -> list[Path]:
    p = Path(path)
    if is_task_dir(p):
        return [p.resolve()]
    return sorted(c.resolve() for c in p.iterdir() if c.is_dir() and is_task_dir(c))


def read_config(task_dir: Path) -> dict[str, Any]:
    try:
        return tomllib.loads((task_dir / "task.toml").read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ValueError(f"{task_dir.name}/task.toml: {exc}") from exc


_FROM = re.compile(r"^\s*FROM\s+(?:--platform=\S+\s+)?(\S+)(?:\s+AS\s+(\S+))?", re.IGNORECASE | re.MULTILINE)


def base_images(dockerfile: str) -> list[str]:
    """The images a Dockerfile starts from (build stages it names itself and `scratch` left out)."""
    stages: set[str] = set()
    out: list[str] = []
    for m in _FROM.finditer(dockerfile):
        image, alias = m.group(1), m.group(2)
        if image.lower() != "scratch" and image.lower() not in stages and image not in out:
            out.append(image)
        if alias:
            stages.add(alias.lower())
    return out


def _digest(directory: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(p for p in directory.rglob("*") if p.is_file()):
        h.update(str(f.relative_to(directory)).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def _has_image(client: Any, name: str) -> bool:
    from docker.errors import ImageNotFound

    try:
        client.images.get(name)
        return True
    except ImageNotFound:
        return False


def build_image(task_dir: Path, config: dict[str, Any], client: Any) -> tuple[str, str | None]:
    """(image, its WORKDIR or None) for a task: `[environment] docker_image` if set (it must be
    present), else environment/Dockerfile built with the local engine, never pulling."""
    env = config.get("environment") or {}
    prebuilt = env.get("docker_image")
    if prebuilt:
        if not _has_image(client, prebuilt):
            raise ValueError(f"{task_dir.name}: [environment] docker_image {prebuilt!r} is not present in the "
                             "local Docker engine (nothing is pulled); build or load it first")
        return prebuilt, _workdir(client, prebuilt)
    env_dir = task_dir / "environment"
    dockerfile = env_dir / "Dockerfile"
    if not dockerfile.is_file():
        raise ValueError(f"{task_dir.name}: environment/Dockerfile is missing (or set [environment] docker_image)")
    for image in base_images(dockerfile.read_text(encoding="utf-8")):
        if not _has_image(client, image):
            raise ValueError(f"{task_dir.name}: environment/Dockerfile starts FROM {image!r}, which is not "
                             "present in the local Docker engine (nothing is pulled); build or load it first")
    name = re.sub(r"[^a-z0-9_.-]+", "-", task_dir.name.lower()).strip("-.") or "task"
    tag = f"{IMAGE_REPO}/{name}:{_digest(env_dir)}"
    if not _has_image(client, tag):
        from docker.errors import BuildError

        try:
            client.images.build(path=str(env_dir), tag=tag, pull=False, rm=True, forcerm=True,
                                timeout=int(float(env.get("build_timeout_sec") or 600)))
        except BuildError as exc:
            lines = [str(c.get("stream") or c.get("error") or "").strip() for c in exc.build_log]
            raise ValueError(f"{task_dir.name}: building environment/Dockerfile failed: {exc.msg}; "
                             f"{' | '.join(x for x in lines if x)[-600:]}") from exc
    return tag, _workdir(client, tag)


def _workdir(client: Any, image: str) -> str | None:
    return (client.images.get(image).attrs.get("Config") or {}).get("WorkingDir") or None


def task_row(task_dir: Path, client: Any, policy_version: int | None = None) -> dict[str, Any]:
    """The TaskRequest fragment of one Harbor task (raises ValueError with a readable message)."""
    config = read_config(task_dir)
    instruction = (task_dir / "instruction.md").read_text(encoding="utf-8")
    if not (task_dir / "tests" / "test.sh").is_file():
        raise ValueError(f"{task_dir.name}: tests/test.sh is missing")
    image, workdir = build_image(task_dir, config, client)
    env, agent, verifier = (config.get(k) or {} for k in ("environment", "agent", "verifier"))
    runtime: dict[str, Any] = {"backend": "docker", "image": image}
    if workdir:
        runtime["workdir"] = workdir
    if env.get("cpus"):
        runtime["cpus"] = float(env["cpus"])
    if env.get("memory_mb"):
        runtime["memory_mb"] = int(env["memory_mb"])
    if "allow_internet" in env:
        runtime["allow_internet"] = bool(env["allow_internet"])
    grader_cfg: dict[str, Any] = {"task_dir": str(task_dir)}
    if verifier.get("timeout_sec"):
        grader_cfg["timeout_seconds"] = float(verifier["timeout_sec"])
    if verifier.get("env"):
        grader_cfg["env"] = {str(k): str(v) for k, v in verifier["env"].items()}
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", task_dir.name).strip("-.")[:100] or "task"
    row: dict[str, Any] = {
        "task_id": f"harbor-{name}" + ("" if policy_version is None else f"-pv{policy_version}"),
        "instruction": instruction, "runtime": runtime,
        "grader": {"strategy": "harbor", "config": grader_cfg},
        "metadata": {"harbor": {"task": task_dir.name, "image": image, **(config.get("metadata") or {})}},
    }
    if agent.get("timeout_sec"):
        row["timeout_seconds"] = float(agent["timeout_sec"])
    return row


def load_rows(path: str | Path, policy_version: int | None = None, client: Any = None) -> list[Row]:
    """One row per Harbor task under `path` (in name order); a task that cannot be read or built
    is a row carrying its error, so one bad task never hides the others."""
    dirs = task_dirs(path)
    if not dirs:
        raise DatasetError(f"{path}: no Harbor task (a directory with task.toml and instruction.md)")
    if client is None:
        try:
            from polar_mq.runtimes.docker import docker_client

            client = docker_client(timeout=600)
            client.ping()
        except Exception as exc:
            raise DatasetError(f"Harbor tasks need the local Docker engine to build their environment: {exc}") \
                from exc
    rows = []
    for n, d in enumerate(dirs, 1):
        try:
            rows.append(Row(n, task_row(d, client, policy_version)))
        except ValueError as exc:
            rows.append(Row(n, None, str(exc)))
    return rows
