"""SWE-bench / SWE-Gym rows (their real field names) → swebench-graded TaskRequests.

A row is in SWE-bench shape when it has `instance_id`, `problem_statement` and `base_commit`
(SWE-Gym rows have the same fields). FAIL_TO_PASS / PASS_TO_PASS may be lists or JSON strings
(the Hub's form); both are checked here so a broken row fails at submit, with its row number,
not hours later at grading. Nothing here imports swebench: submitting needs no extra; the grader
builds the eval script from swebench's own test-spec code when the row carries none.
"""

from __future__ import annotations

import json
import re
from typing import Any

REQUIRED = ("instance_id", "repo", "base_commit", "problem_statement")
TEST_LISTS = ("FAIL_TO_PASS", "PASS_TO_PASS")

DEFAULT_INSTRUCTION = (
    "You are working in a checkout of the repository {repo} at commit {base_commit}.\n"
    "Resolve the following issue by editing the repository's source files (not its tests).\n\n"
    "<issue>\n{problem_statement}\n</issue>\n")

_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


def is_swebench_row(row: dict[str, Any]) -> bool:
    return "instance_id" in row and "problem_statement" in row and "base_commit" in row


def test_list(value: Any, name: str) -> list[str]:
    """A FAIL_TO_PASS / PASS_TO_PASS value as a list of test ids (lists or JSON strings)."""
    if value is None:
        return []
    if isinstance(value, str):
        if not value.strip():
            return []
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{name} is not a JSON list: {exc.msg} at column {exc.colno}") from exc
    if not isinstance(value, list) or not all(isinstance(t, str) for t in value):
        raise ValueError(f"{name} must be a list of test ids (strings)")
    return value


def check_row(row: dict[str, Any]) -> None:
    missing = [k for k in REQUIRED if not isinstance(row.get(k), str) or not row[k].strip()]
    if missing:
        raise ValueError(f"SWE-bench row without {', '.join(missing)}")
    for name in TEST_LISTS:
        test_list(row.get(name), name)
    if not test_list(row.get("FAIL_TO_PASS"), "FAIL_TO_PASS"):
        raise ValueError("FAIL_TO_PASS is empty: nothing would tell a fix from no fix")


def docker_instance_id(instance_id: str) -> str:
    """swebench's image-name form of an instance id: lower case, and `__` → `_1776_` (Docker Hub
    repository names may not contain `__`; swebench's TestSpec.instance_image_key does this)."""
    return instance_id.lower().replace("__", "_1776_")


def fill(template: str, fields: dict[str, Any]) -> str:
    """Replace `{name}` for the names in `fields`; every other brace is left as written (so a
    template may contain JSON or shell code)."""
    def sub(m: re.Match[str]) -> str:
        return str(fields[m.group(1)]) if m.group(1) in fields else m.group(0)
    return _PLACEHOLDER.sub(sub, template)


def image_name(template: str, row: dict[str, Any]) -> str:
    """`--image-template`: `{instance_id}` in swebench's image-name form (hub images),
    `{instance_id_lower}` lower case (images built here: `polar-mq image build`), `{instance_id_raw}`
    as written, any other row field by name (e.g. `sweb.eval.x86_64.{instance_id}:latest`)."""
    iid = str(row.get("instance_id", ""))
    fields = {k: v for k, v in row.items() if isinstance(v, (str, int, float))}
    return fill(template, {**fields, "instance_id": docker_instance_id(iid), "instance_id_raw": iid,
                           "instance_id_lower": iid.lower()})


def instruction(row: dict[str, Any], template: str | None) -> str:
    fields = {k: v for k, v in row.items() if isinstance(v, (str, int, float))}
    return fill(template or DEFAULT_INSTRUCTION, fields)


DEFAULT_EVAL_COMMAND = "python -m pytest -rA -p no:cacheprovider {test_files}"


def test_files(inst: dict[str, Any]) -> list[str]:
    """The test files named by FAIL_TO_PASS / PASS_TO_PASS ids (`path.py::test`), in order."""
    files = [t.split("::", 1)[0] for t in inst["FAIL_TO_PASS"] + inst["PASS_TO_PASS"] if "::" in t]
    return list(dict.fromkeys(f for f in files if " " not in f))


def grader_config(row: dict[str, Any], base: dict[str, Any] | None) -> dict[str, Any]:
    """The swebench grader's config: the template's (repo_dir, eval_command, timeout...) plus the
    row as `instance`, with FAIL_TO_PASS / PASS_TO_PASS as lists. A row without `eval_script`
    (SWE-Gym) gets the template's `eval_command` or DEFAULT_EVAL_COMMAND, `{test_files}` and
    `{test_ids}` filled in; the grader wraps it into swebench's eval-script shape and runs it
    through swebench's TestSpec and log parsers."""
    inst = dict(row)
    for name in TEST_LISTS:
        inst[name] = test_list(row.get(name), name)
    cfg = {**(base or {}), "instance": inst}
    if not inst.get("eval_script"):
        import shlex

        command = cfg.get("eval_command") or DEFAULT_EVAL_COMMAND
        ids = inst["FAIL_TO_PASS"] + inst["PASS_TO_PASS"]
        cfg["eval_command"] = fill(command, {"test_files": " ".join(shlex.quote(f) for f in test_files(inst)),
                                             "test_ids": " ".join(shlex.quote(t) for t in ids)})
    else:
        cfg.pop("eval_command", None)
    return cfg
