"""Offline SFT generation: keep only trajectories whose grader passes, as SFT JSONL.

Turned on per task with `grader.config.keep_only_passing: true` (any grader). After grading, the
postrun stage calls `record(...)`: a passing trajectory (swebench: resolved; others: `Grade.passed`,
else reward >= `pass_threshold`, default 1.0) is appended to the SFT file as OpenAI-chat rows
(`messages` ending with the assistant's reply, `tools`, ids, reward — `polar_mq.rl.export.sft_rows`),
and the counts are updated:

  file   `grader.config.sft_path` if set (several tasks may share one file: one dataset across
         SWE-bench instances), else `<results_dir>/<task_id>/sft.jsonl`
  counts `<file>.stats.json`: {"attempted", "accepted", "acceptance_rate", "errors", "rows",
         "sessions": {session_id: "accepted" | "rejected" | "error"}}

Infrastructure errors (Grade.status "error") are not attempts (they are counted as `errors`).
Recording is idempotent per session (a postrun redone after a worker died adds nothing) and safe
across worker processes (an flock around append + counts). The trajectory itself is stored as
usual either way, with `metadata["sft"] = "accepted" | "rejected" | "error"` (the postrun stage
sets it from `record`'s answer) and `metadata["sft_file"]` (the SFT file's path on the worker; set by
`record`), which `polar-mq results ID --format sft` uses to export the accepted rows and counts.

Tests: tests/graders/test_graders.py.
"""

from __future__ import annotations

import fcntl
import json
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterable, Iterator

from polar_mq.model import Trajectory
from polar_mq.graders.base import ERROR, Grade


def sft_path(results_dir: str | os.PathLike[str], task_id: str | None, options: dict[str, Any]) -> Path:
    if options.get("sft_path"):
        return Path(options["sft_path"])
    return Path(results_dir) / (task_id or "none") / "sft.jsonl"


def stats_path(path: Path) -> Path:
    return path.with_name(path.name + ".stats.json")


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def read_stats(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The counts for an SFT file (zeros when nothing was recorded yet)."""
    try:
        return json.loads(stats_path(Path(path)).read_text())
    except (OSError, ValueError):
        return {"attempted": 0, "accepted": 0, "acceptance_rate": 0.0, "errors": 0, "rows": 0, "sessions": {}}


def summarize(verdicts: Iterable[str | None]) -> dict[str, Any]:
    """attempted / accepted / errors / acceptance_rate of "accepted" | "rejected" | "error" verdicts
    (errors are not attempts; anything else is ignored)."""
    values = [v for v in verdicts if v in ("accepted", "rejected", "error")]
    attempted = sum(v != "error" for v in values)
    accepted = values.count("accepted")
    return {"attempted": attempted, "accepted": accepted, "errors": values.count("error"),
            "acceptance_rate": round(accepted / attempted, 4) if attempted else 0.0}


def offline_sft_rows(trajectories: Iterable[Trajectory], roles: Iterable[str] | None = None
                     ) -> Iterator[dict[str, Any]]:
    """The SFT file's rows for trajectories (as `record` writes them: `sft_rows` plus instance_id,
    taken from the grade in the trajectory's metadata when there is no Grade at hand)."""
    from polar_mq.rl.export import sft_rows

    for traj in trajectories:
        instance_id = (((traj.metadata or {}).get("grade") or {}).get("metadata") or {}).get("instance_id")
        for row in sft_rows([traj], roles=roles):
            yield {**row, "instance_id": instance_id}


def record(path: str | os.PathLike[str], traj: Trajectory, grade: Grade, *, threshold: float = 1.0,
           roles: list[str] | None = None) -> str:
    """Record one graded trajectory; returns "accepted", "rejected" or "error"."""
    from polar_mq.rl.export import sft_rows

    path = Path(path)
    traj.metadata["sft_file"] = os.path.abspath(path)
    verdict = "error" if grade.status == ERROR else ("accepted" if grade.is_passing(threshold) else "rejected")
    with _locked(path):
        stats = read_stats(path)
        sessions = stats.setdefault("sessions", {})
        if traj.session_id in sessions:
            return sessions[traj.session_id]
        rows = list(sft_rows([traj], roles=roles)) if verdict == "accepted" else []
        if rows:
            with open(path, "a", encoding="utf-8") as fh:
                for row in rows:
                    fh.write(json.dumps({**row, "instance_id": grade.metadata.get("instance_id")},
                                        ensure_ascii=False) + "\n")
                fh.flush()
                os.fsync(fh.fileno())
        elif not path.exists():
            path.touch()
        sessions[traj.session_id] = verdict
        stats.update(summarize(sessions.values()), rows=int(stats.get("rows", 0)) + len(rows))
        tmp = stats_path(path).with_suffix(".tmp")
        tmp.write_text(json.dumps(stats, indent=1))
        tmp.replace(stats_path(path))
    return verdict
