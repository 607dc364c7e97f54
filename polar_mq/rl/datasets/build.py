"""One TaskRequest per dataset row: the template merged with the row, sampling options applied,
an id that depends only on the row and the policy version (so resubmitting creates nothing new).

- SWE-bench / SWE-Gym rows: the template's agent, runtime, builder, limits; the instruction from
  the template's `instruction` with `{problem_statement}`, `{repo}`, ... filled in (default
  `swebench_rows.DEFAULT_INSTRUCTION`); grader `swebench` with the row as `instance`; runtime
  image from `--image-template`; task id = instance_id (+ `-pv<V>`).
- Generic rows: `instruction` required; `task_id` used as written; `metadata` and any TaskRequest
  field in the row (num_samples, agent, runtime, grader...) merged over the template; other
  columns go to `metadata` under their own names (e.g. a reference answer for a custom grader);
  task id when absent = `row-` + hash of the row and the policy version.
"""

from __future__ import annotations

import base64
import copy
import datetime as _dt
import hashlib
import json
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import yaml

from polar_mq.taskspec import ValidationError, parse_task
from polar_mq.rl.datasets import swebench_rows
from polar_mq.rl.datasets.readers import DatasetError
from polar_mq.rl.datasets.readers import Row

TASK_FIELDS = ("task_id", "instruction", "num_samples", "timeout_seconds", "agent", "runtime", "builder",
               "grader", "evaluator", "callback_url", "metadata", "early_stop_min_usable_sessions",
               "dispatch_priority")
_ID_OK = re.compile(r"[^A-Za-z0-9._-]+")


@dataclass
class TaskOptions:
    samples: int | None = None
    policy_version: int | None = None
    image_template: str | None = None
    limit: int | None = None
    shuffle: bool = False
    seed: int | None = None
    early_stop: int | None = None  # early_stop_min_usable_sessions of every task
    priority: int | None = None  # dispatch_priority of every task


@dataclass
class BuiltTask:
    row: int
    task: dict[str, Any] | None
    error: str | None = None

    @property
    def task_id(self) -> str | None:
        return self.task["task_id"] if self.task else None


def load_template(path: str | Path | None) -> dict[str, Any]:
    if path is None:
        return {}
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise DatasetError(f"template {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise DatasetError(f"template {path}: expected a TaskRequest mapping")
    unknown = sorted(set(data) - set(TASK_FIELDS))
    if unknown:
        raise DatasetError(f"template {path}: unknown TaskRequest field(s) {unknown}")
    return data


def jsonable(value: Any) -> Any:
    """Row values as JSON (Parquet / datasets give datetimes, bytes, numpy scalars)."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, (_dt.datetime, _dt.date)):
        return value.isoformat()
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if hasattr(value, "item") and callable(value.item):  # numpy scalar
        return value.item()
    return value


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else copy.deepcopy(v)
    return out


def _safe_id(text: str) -> str:
    cleaned = _ID_OK.sub("-", text).strip("-.") or "task"
    if len(cleaned) <= 128:
        return cleaned
    return cleaned[:111] + "-" + hashlib.sha256(text.encode()).hexdigest()[:16]


def task_id_for(row: dict[str, Any], policy_version: int | None) -> str:
    suffix = "" if policy_version is None else f"-pv{policy_version}"
    if swebench_rows.is_swebench_row(row):
        return _safe_id(f"{row['instance_id']}{suffix}")
    digest = hashlib.sha256(json.dumps([row, policy_version], sort_keys=True, default=str).encode()).hexdigest()
    return f"row-{digest[:20]}"


def build_task(row: dict[str, Any], template: dict[str, Any], opts: TaskOptions) -> dict[str, Any]:
    """The TaskRequest for one row (validated); raises ValueError with a readable message."""
    row = jsonable(row)
    if swebench_rows.is_swebench_row(row):
        swebench_rows.check_row(row)
        body = {k: copy.deepcopy(v) for k, v in template.items() if k not in ("task_id",)}
        body["instruction"] = swebench_rows.instruction(row, template.get("instruction"))
        grader = template.get("grader") or template.get("evaluator")
        base_cfg = grader.get("config") if isinstance(grader, dict) and grader.get("strategy") == "swebench" else None
        body.pop("evaluator", None)
        body["grader"] = {"strategy": "swebench", "config": swebench_rows.grader_config(row, base_cfg)}
        body["metadata"] = {**(template.get("metadata") or {}), "instance_id": row["instance_id"],
                            "repo": row["repo"]}
        body["task_id"] = task_id_for(row, opts.policy_version)
        image_tpl = opts.image_template
        if image_tpl:
            body["runtime"] = {**(body.get("runtime") or {}), "image": swebench_rows.image_name(image_tpl, row)}
    else:
        if not isinstance(row.get("instruction"), str) or not row["instruction"].strip():
            raise ValueError("row has no `instruction` and is not in SWE-bench shape "
                             "(instance_id, problem_statement, base_commit)")
        known = {k: v for k, v in row.items() if k in TASK_FIELDS}
        extra = {k: v for k, v in row.items() if k not in TASK_FIELDS}
        body = _merge({k: v for k, v in template.items() if k != "task_id"}, known)
        if isinstance(row.get("metadata"), dict) or extra:
            body["metadata"] = {**extra, **(body.get("metadata") or {})}
        body["task_id"] = row.get("task_id") or task_id_for(row, opts.policy_version)
        if opts.image_template:
            body["runtime"] = {**(body.get("runtime") or {}),
                               "image": swebench_rows.image_name(opts.image_template, row)}
    if opts.samples is not None:
        body["num_samples"] = opts.samples
    if opts.policy_version is not None:
        body["metadata"] = {**(body.get("metadata") or {}), "policy_version": opts.policy_version}
    if opts.early_stop is not None:
        body["early_stop_min_usable_sessions"] = opts.early_stop
    if opts.priority is not None:
        body["dispatch_priority"] = opts.priority
    try:
        parse_task(body)
    except ValidationError as exc:
        raise ValueError(f"{exc.field}: {exc.message}") from exc
    return body


def select(rows: list[Row], opts: TaskOptions) -> list[Row]:
    rows = list(rows)
    if opts.shuffle:
        random.Random(opts.seed).shuffle(rows)
    if opts.limit is not None:
        rows = rows[: max(0, opts.limit)]
    return rows


def build_tasks(rows: Iterable[Row], template: dict[str, Any], opts: TaskOptions | None = None) -> list[BuiltTask]:
    """One BuiltTask per selected row, in (shuffled) row order; bad rows carry their error."""
    opts = opts or TaskOptions()
    out: list[BuiltTask] = []
    for row in select(list(rows), opts):
        if row.error is not None or row.data is None:
            out.append(BuiltTask(row.number, None, row.error or "empty row"))
            continue
        try:
            out.append(BuiltTask(row.number, build_task(row.data, template, opts)))
        except ValueError as exc:
            out.append(BuiltTask(row.number, None, str(exc)))
    return out
