"""(Re)generate the SWE-Gym-shaped rows of the textkit example: `python -m examples.swegym.make_rows
--out DIR` writes DIR/textkit (a git repository holding one base commit per instance, tagged with
its instance id) and DIR/rows.jsonl (one row per instance, SWE-Gym's fields).

Per instance (instances.py): the base tree is the library (repo/) with the bug injected and the
instance's FAIL_TO_PASS tests removed; it is committed as a root commit (no ancestor holds the fix)
with a fixed author, committer and date, so its sha is the same on every machine and the checked-in
examples/swegym/rows.jsonl stays valid (tests/rl/test_swegym_rows.py regenerates and compares).
test_patch = the diff that adds the FAIL_TO_PASS tests back; patch (the gold patch) = the diff that
removes the bug. The rows are validated by running pytest: on the base + test_patch every
FAIL_TO_PASS test fails, PASS_TO_PASS is every other test of those files that passes, and with the
gold patch all of them pass; a row that does not hold this is an error, not written.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO_SRC = HERE / "repo"
REPO_NAME = "polar-mq/textkit"
VERSION = "0.3"
CREATED_AT = "2026-11-20T12:00:00Z"
GIT_ENV = {"GIT_AUTHOR_NAME": "textkit", "GIT_AUTHOR_EMAIL": "textkit@example.invalid",
           "GIT_AUTHOR_DATE": "2026-11-20T12:00:00+00:00", "GIT_COMMITTER_NAME": "textkit",
           "GIT_COMMITTER_EMAIL": "textkit@example.invalid", "GIT_COMMITTER_DATE": "2026-11-20T12:00:00+00:00",
           "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull}
_RESULT = re.compile(r"^(PASSED|FAILED|ERROR) (\S+::\S+)", re.MULTILINE)


def instance_id(number: int) -> str:
    return f"{REPO_NAME.replace('/', '__')}-{number}"


def library_files() -> dict[str, str]:
    files = {}
    for p in sorted(REPO_SRC.rglob("*")):
        rel = p.relative_to(REPO_SRC).as_posix()
        if p.is_file() and "__pycache__" not in rel and ".pytest_cache" not in rel:
            files[rel] = p.read_text(encoding="utf-8")
    return files


def without_tests(source: str, names: list[str]) -> str:
    """`source` without the top-level test functions `names` (and the blank lines before each)."""
    lines = source.splitlines(keepends=True)
    spans = [(n.lineno - 1 - len(n.decorator_list), n.end_lineno or n.lineno)
             for n in ast.parse(source).body if isinstance(n, ast.FunctionDef) and n.name in names]
    if len(spans) != len(names):
        raise ValueError(f"tests {names} not all found")
    for start, end in sorted(spans, reverse=True):
        while start > 0 and not lines[start - 1].strip():
            start -= 1
        del lines[start:end]
    return "".join(lines)


def base_tree(files: dict[str, str], inst: dict[str, Any]) -> dict[str, str]:
    tree = dict(files)
    for path, good, bad in inst["bug"]:
        if tree[path].count(good) != 1:
            raise ValueError(f"instance {inst['number']}: {good!r} is not exactly once in {path}")
        tree[path] = tree[path].replace(good, bad)
    by_file: dict[str, list[str]] = {}
    for test in inst["fail_to_pass"]:
        path, name = test.split("::")
        by_file.setdefault(path, []).append(name)
    for path, names in by_file.items():
        tree[path] = without_tests(tree[path], names)
    return tree


def git(repo: Path, *args: str, env: dict[str, str] | None = None, input: str | None = None) -> str:
    out = subprocess.run(["git", "-c", "commit.gpgsign=false", "-c", "core.autocrlf=false", *args], cwd=repo,
                         capture_output=True, text=True, input=input, env={**os.environ, **GIT_ENV, **(env or {})})
    if out.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)}: {out.stderr.strip()}")
    return out.stdout


def write_tree(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text, encoding="utf-8")
        p.chmod(0o644)


def commit_root(repo: Path, files: dict[str, str], message: str) -> str:
    """A root commit of exactly `files` (a fixed identity and date: the same sha everywhere)."""
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp) / "work"
        write_tree(work, files)
        env = {"GIT_INDEX_FILE": str(Path(tmp) / "index"), "GIT_WORK_TREE": str(work),
               "GIT_DIR": str(repo / ".git")}
        git(repo, "add", "-A", ".", env=env)
        tree = git(repo, "write-tree", env=env).strip()
        return git(repo, "commit-tree", tree, "-m", message, env=env).strip()


def pytest_statuses(work: Path, test_files: list[str]) -> dict[str, str]:
    out = subprocess.run([sys.executable, "-m", "pytest", "-rA", "-p", "no:cacheprovider", *test_files],
                         cwd=work, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"})
    return {m.group(2): m.group(1) for m in _RESULT.finditer(out.stdout)}


def build_row(repo: Path, files: dict[str, str], inst: dict[str, Any]) -> dict[str, Any]:
    """The row of one instance: its root commit (tagged), test_patch and gold patch; not validated."""
    iid = instance_id(inst["number"])
    base = base_tree(files, inst)
    sha = commit_root(repo, base, f"textkit {VERSION}\n\nThe base of {iid}.")
    git(repo, "tag", "-f", iid, sha)
    test_files = sorted({t.split("::")[0] for t in inst["fail_to_pass"]})
    src_files = sorted({p for p, _, _ in inst["bug"]})
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp) / "w"
        git(repo, "worktree", "add", "--detach", str(work), sha)
        try:
            write_tree(work, {f: files[f] for f in test_files})
            test_patch = git(work, "diff", "--no-color", "--no-ext-diff")
            git(work, "checkout", "--", ".")
            write_tree(work, {f: files[f] for f in src_files})
            gold = git(work, "diff", "--no-color", "--no-ext-diff")
        finally:
            git(repo, "worktree", "remove", "--force", str(work))
    return {
        "instance_id": iid, "repo": REPO_NAME, "base_commit": sha, "patch": gold, "test_patch": test_patch,
        "problem_statement": inst["problem_statement"], "hints_text": "", "created_at": CREATED_AT,
        "version": VERSION, "FAIL_TO_PASS": json.dumps(list(inst["fail_to_pass"])), "PASS_TO_PASS": "[]",
        "environment_setup_commit": sha,
    }


def validate(repo: Path, row: dict[str, Any]) -> dict[str, Any]:
    """PASS_TO_PASS measured, and the row checked: on the base + test_patch every FAIL_TO_PASS test
    fails, with the gold patch every FAIL_TO_PASS and PASS_TO_PASS test passes (else ValueError)."""
    iid, f2p = row["instance_id"], json.loads(row["FAIL_TO_PASS"])
    test_files = sorted({t.split("::")[0] for t in f2p})
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        archive = subprocess.run(["git", "archive", row["base_commit"]], cwd=repo, capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", str(work)], input=archive.stdout, check=True)
        git(work, "apply", "-", input=row["test_patch"])
        before = pytest_statuses(work, test_files)
        git(work, "apply", "-", input=row["patch"])
        after = pytest_statuses(work, test_files)
    p2p = sorted(t for t, s in before.items() if s == "PASSED" and t not in f2p)
    if any(before.get(t) == "PASSED" for t in f2p) or not all(t in before for t in f2p):
        raise ValueError(f"{iid}: FAIL_TO_PASS must fail on the base commit: {[(t, before.get(t)) for t in f2p]}")
    bad = [t for t in f2p + p2p if after.get(t) != "PASSED"]
    if bad:
        raise ValueError(f"{iid}: the gold patch leaves {bad} failing")
    return {**row, "PASS_TO_PASS": json.dumps(p2p)}


def generate(out: Path) -> tuple[Path, Path]:
    """Write OUT/textkit (the git repository) and OUT/rows.jsonl; returns both paths."""
    from examples.swegym.instances import INSTANCES

    out.mkdir(parents=True, exist_ok=True)
    repo = out / "textkit"
    if repo.exists():
        shutil.rmtree(repo)
    repo.mkdir()
    git(repo, "init", "-q")
    files = library_files()
    built = [build_row(repo, files, inst) for inst in INSTANCES]
    with ThreadPoolExecutor(max_workers=4) as pool:  # the pytest runs, side by side
        rows = list(pool.map(lambda r: validate(repo, r), built))
    rows_path = out / "rows.jsonl"
    rows_path.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows), encoding="utf-8")
    return repo, rows_path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="directory for textkit/ (the git repository) and rows.jsonl")
    args = ap.parse_args(argv)
    repo, rows = generate(Path(args.out).resolve())
    n = sum(1 for _ in rows.open())
    print(f"swegym rows: {n} instances in {rows}, repository {repo}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
