"""Datasets → TaskRequests: what `polar-mq submit --dataset` does, as a library for scripts.

    from polar_mq.rl.datasets import load_rows, build_tasks, TaskOptions
    rows = load_rows("swe-gym.jsonl")                     # JSONL, JSON, Parquet, HF datasets dir
    for item in build_tasks(rows, template, TaskOptions(samples=8, policy_version=3)):
        if item.error: print(item.row, item.error)       # a bad row never stops the others
        else: client.submit(item.task)

Modules: `readers` (files → rows), `swebench_rows` (SWE-bench / SWE-Gym rows → swebench-graded
tasks, image names), `build` (template merge, ids, sampling options), `submit` (submission with
per-row results).

Tests: tests/rl/test_datasets.py.
"""

from polar_mq.rl.datasets.build import BuiltTask
from polar_mq.rl.datasets.build import TaskOptions
from polar_mq.rl.datasets.build import build_task
from polar_mq.rl.datasets.build import build_tasks
from polar_mq.rl.datasets.build import load_template
from polar_mq.rl.datasets.build import task_id_for
from polar_mq.rl.datasets.readers import DatasetError
from polar_mq.rl.datasets.readers import Row
from polar_mq.rl.datasets.readers import load_rows
from polar_mq.rl.datasets.swebench_rows import image_name
from polar_mq.rl.datasets.swebench_rows import is_swebench_row

__all__ = ["BuiltTask", "DatasetError", "Row", "TaskOptions", "build_task", "build_tasks", "image_name",
           "is_swebench_row", "load_rows", "load_template", "task_id_for"]
