"""`harbor` grader: a Harbor task's tests/test.sh in a fresh container, its reward file the reward.

The session's container is committed (the agent's files as it left them, none of its processes),
a fresh container is started from that snapshot with the task's limits and the verifier's env,
the task's tests/ are copied to /tests, and `bash /tests/test.sh` runs under the grading budget
(`timeout_seconds`, from task.toml [verifier] timeout_sec). The reward is read as Harbor defines
it: /logs/verifier/reward.txt (one number) first, else /logs/verifier/reward.json (an object of
numbers: its "reward" if present, the only value if one, else their mean; all kept in
`details.rewards`). No reward file, or a session without a docker container, is an infrastructure
error (status error: the trainer masks it), never reward 0. The snapshot and the fresh container
are removed afterwards. Guarded by tests/graders/test_harbor.py.
"""

from __future__ import annotations

import dataclasses
import json
import re
import tempfile
import uuid
from pathlib import Path
from typing import Any

from polar_mq.model import Trajectory
from polar_mq.graders.base import Grade, GradeContext, Grader, GraderTimeout, InfraError

TESTS_DIR = "/tests"
VERIFIER_DIR = "/logs/verifier"
RUN_TESTS = f"mkdir -p {VERIFIER_DIR} /logs/agent && bash {TESTS_DIR}/test.sh"


def parse_reward(verifier_dir: Path) -> tuple[float, dict[str, float]]:
    """(reward, every named reward) from a verifier dir; ValueError when there is none."""
    txt, js = verifier_dir / "reward.txt", verifier_dir / "reward.json"
    if txt.is_file() and txt.read_text().strip():
        value = float(txt.read_text().strip())
        return value, {"reward": value}
    if js.is_file():
        data = json.loads(js.read_text())
        if isinstance(data, (int, float)) and not isinstance(data, bool):
            return float(data), {"reward": float(data)}
        if not isinstance(data, dict) or not data:
            raise ValueError("reward.json must be an object of numbers")
        rewards = {str(k): float(v) for k, v in data.items()}
        if "reward" in rewards:
            return rewards["reward"], rewards
        return sum(rewards.values()) / len(rewards), rewards
    raise ValueError(f"tests/test.sh wrote neither {VERIFIER_DIR}/reward.txt nor reward.json")


class HarborGrader(Grader):
    name = "harbor"

    def __init__(self, task_dir: str, env: dict[str, str] | None = None, **unknown: Any):
        if unknown:
            raise ValueError(f"grader 'harbor' got unknown config {sorted(unknown)} (allowed: task_dir, env)")
        super().__init__(task_dir=task_dir, env=env)
        self.task_dir = Path(task_dir)
        self.env = {str(k): str(v) for k, v in (env or {}).items()}

    def evaluate(self, trajectory: Trajectory, context: GradeContext) -> Grade:
        tests = self.task_dir / "tests"
        if not (tests / "test.sh").is_file():
            raise InfraError(f"{tests}/test.sh is not readable on this worker")
        handle = context.runtime
        if handle is None or handle.backend != "docker":
            raise InfraError("grader 'harbor' needs the session's docker container (runtime.backend docker)")
        if context.get_runtime is not None:
            runtime = context.get_runtime("docker")
        else:
            from polar_mq.runtimes.docker import DockerRuntime

            runtime = DockerRuntime()
        try:
            session_container = runtime.client.containers.get(handle.container_id or handle.container)
            tag = re.sub(r"[^a-z0-9_.-]+", "-", context.session_id.lower())[:100] + "-" + uuid.uuid4().hex[:8]
            snapshot = session_container.commit(repository="polar-harbor-grade", tag=tag)
        except Exception as exc:  # noqa: BLE001 - the engine's errors are infrastructure
            raise InfraError(f"cannot snapshot the session's container: {exc}") from exc
        fresh = None
        try:
            spec = dataclasses.replace(context.runtime_spec, backend="docker", image=snapshot.id,
                                       env={**context.runtime_spec.env, **self.env}, prepare=[])
            grade_dir = Path(tempfile.mkdtemp(prefix="harbor-", dir=_ensure(context.log_dir())))
            fresh = runtime.start(spec, grade_dir, f"{context.session_id}.harbor-grade")
            runtime.upload(fresh, tests, TESTS_DIR)
            result = runtime.exec(fresh, ["sh", "-c", RUN_TESTS], env={}, timeout=max(1.0, context.remaining()),
                                  log_path=grade_dir / "test.log")
            details: dict[str, Any] = {"exit_code": result.exit_code, "output_tail": result.output_tail[-2000:],
                                       "image": snapshot.id, "log": str(grade_dir / "test.log")}
            if result.timed_out:
                raise GraderTimeout(f"tests/test.sh ran past the grading budget ({result.duration_s:.0f} s)")
            got = grade_dir / "verifier"
            try:
                runtime.download(fresh, VERIFIER_DIR, got)
                reward, rewards = parse_reward(got)
            except Exception as exc:  # noqa: BLE001 - no reward is the verifier's failure, not 0
                raise InfraError(f"no reward from tests/test.sh (exit {result.exit_code}): {exc}; "
                                 f"output: {result.output_tail[-500:]}") from exc
            details["rewards"] = rewards
            return Grade(reward, details, passed=reward >= 1.0)
        finally:
            if fresh is not None:
                runtime.stop(fresh)
            try:
                runtime.client.images.remove(snapshot.id, force=True)
            except Exception:  # noqa: BLE001 - best effort: a leftover snapshot is only disk
                pass


def _ensure(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path
