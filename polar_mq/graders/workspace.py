"""Runtime plumbing for graders: the session's live runtime, a fresh one, the agent's diff.

- `session_workspace(context)`: the session's runtime (the handle from the session record).
- `fresh_workspace(context, config)`: a new runtime from the task's runtime spec (same image),
  populated from `repo_source` (a pristine copy of the repository; how the `local` backend gets a
  "fresh runtime from the same image") or, without it, by re-running the task's prepare steps.
- `extract_diff`: `git diff` of the repository against a base commit, through a throw-away index
  (the agent's git state is not touched), untracked files included, caches/build outputs and
  binary files excluded.
- `apply_patch`: `git apply`, then `patch --fuzz` as the fallback.
- `guard_patch`: the part of the agent's patch a fresh runtime applies: nothing under protected
  test paths or their test directories, no test-configuration file (conftest.py, pytest.ini, ...).
- `restore_paths`: put protected files (tests) back as they are at the base commit, deleting files
  the agent added under them, so grading never runs the agent's edits of the tests;
  `restore_dirs`: the guarded test directories' tracked files back as at the base commit.

Every command runs under the grading budget (`GradeContext.deadline`); a command that outlives it
raises GraderTimeout. Problems that are not the agent's fault raise InfraError.
"""

from __future__ import annotations

import re
import shlex
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from polar_mq.model import RuntimeHandle
from polar_mq.runtimes import NoIsolation, get_runtime, resolve_backend
from polar_mq.runtimes.local import allow_local_exec_from_env, refused_prepare
from polar_mq.runtimes.base import ExecResult
from polar_mq.taskspec import RuntimeSpec
from polar_mq.graders.base import GradeContext, GraderTimeout, InfraError

# Never part of the agent's patch: caches, build outputs, environments.
DEFAULT_EXCLUDES = (
    "**/__pycache__/**", "**/*.pyc", "**/*.pyo", "**/.pytest_cache/**", "**/.mypy_cache/**",
    "**/.ruff_cache/**", "**/.hypothesis/**", "**/*.egg-info/**", "**/.tox/**", "**/.nox/**",
    "**/.venv/**", "**/node_modules/**", "**/.ipynb_checkpoints/**", "**/.DS_Store", "**/*.so",
    "**/*.o", "**/*.a", "**/*.dylib", "**/*.dll", "**/*.class", "**/.coverage", "**/.polar_grade/**",
)
GRADE_DIR = ".polar_grade"  # scratch dir (relative to the runtime's workdir) for patch and scripts
NO_GIT, NO_PATCH, NO_REPO, BAD_BASE = 97, 98, 95, 94


class Workspace:
    """A runtime handle plus budgeted command execution with per-command log files."""

    def __init__(self, runtime: Any, handle: RuntimeHandle, context: GradeContext, log_dir: Path,
                 label: str):
        self.runtime = runtime
        self.handle = handle
        self.context = context
        self.log_dir = Path(log_dir)
        self.label = label
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._n = 0

    def run(self, command: str, name: str, *, env: dict[str, str] | None = None,
            timeout: float | None = None, check_budget: bool = True) -> ExecResult:
        """Run `command` (bash) in the runtime; returns the ExecResult (`log_path` holds the output).

        The timeout is the smaller of `timeout` and what is left of the grading budget; with
        `check_budget`, a command that times out raises GraderTimeout."""
        left = self.context.remaining()
        if left <= 0:
            raise GraderTimeout(f"grading budget spent before {name!r}")
        limit = left if timeout is None else min(left, timeout)
        self._n += 1
        log_path = self.log_dir / f"{self.label}-{self._n:02d}-{name}.log"
        if log_path.exists():
            log_path.unlink()  # exec appends; one log per command
        try:
            # bash by name: the scripts here use arrays and process substitution, and a runtime's
            # own shell may be dash (docker's `sh -c`; tests/runtimes/test_instance_images.py)
            result = self.runtime.exec(self.handle, ["bash", "-c", command], env=dict(env or {}), timeout=limit,
                                       log_path=log_path)
        except Exception as exc:  # the runtime itself failed (container gone, daemon down...)
            raise InfraError(f"{self.label} runtime could not run {name!r}: {exc}") from exc
        if not result.log_path:
            result.log_path = str(log_path)
        if result.timed_out and check_budget:
            raise GraderTimeout(f"{name!r} did not finish within the grading budget ({limit:.0f} s)")
        return result

    def output(self, result: ExecResult) -> str:
        if result.log_path and Path(result.log_path).exists():
            return Path(result.log_path).read_text(errors="replace")
        return result.output_tail

    def upload_text(self, text: str, dst: str) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            src = Path(tmp) / Path(dst).name
            src.write_text(text)
            self.runtime.upload(self.handle, src, dst)

    def download_text(self, src: str) -> str | None:
        with tempfile.TemporaryDirectory() as tmp:
            dst = Path(tmp) / "file"
            try:
                self.runtime.download(self.handle, src, dst)
            except (OSError, RuntimeError):
                return None
            return dst.read_text(errors="replace") if dst.is_file() else None


def _runtime_for(context: GradeContext, backend: str) -> Any:
    factory = context.get_runtime or get_runtime
    try:
        return factory(backend)
    except Exception as exc:
        raise InfraError(f"runtime backend {backend!r} unavailable: {exc}") from exc


def session_workspace(context: GradeContext) -> Workspace:
    handle = context.runtime
    if not handle:
        raise InfraError("the session has no runtime to grade in (it never started)")
    backend = handle.backend or context.runtime_spec.backend
    return Workspace(_runtime_for(context, backend), handle, context, context.log_dir(handle), "session")


@contextmanager
def fresh_workspace(context: GradeContext, config: dict[str, Any]) -> Iterator[Workspace]:
    """A fresh runtime from the task's runtime spec, populated with the pristine repository.

    config: `repo_source` (host path copied to `repo_dir`), `rerun_prepare` (default: true when
    there is no repo_source), `keep_fresh` (keep the local copy after grading, for debugging)."""
    spec = context.runtime_spec
    live = context.runtime
    try:
        backend = resolve_backend(spec, live)
    except NoIsolation as exc:
        raise InfraError(f"fresh runtime: {exc}") from exc
    runtime = _runtime_for(context, backend)
    session_dir = context.session_dir or (live.session_dir if live and live.session_dir else None)
    root = Path(session_dir) if session_dir else context.log_dir()
    n = 0
    while (root / "grade" / f"fresh-{n}").exists():
        n += 1
    fresh_dir = root / "grade" / f"fresh-{n}"
    sid = f"{context.session_id}.grade{n}"
    try:
        handle = runtime.start(spec, fresh_dir, sid)
    except Exception as exc:
        raise InfraError(f"fresh runtime could not start: {exc}") from exc
    ws = Workspace(runtime, handle, context, context.log_dir(handle), f"fresh{n}")
    try:
        repo_dir = config.get("repo_dir") or "."
        source = config.get("repo_source")
        if source:
            if not Path(source).is_dir():
                raise InfraError(f"repo_source {source!r} is not a directory")
            try:
                runtime.upload(handle, Path(source), repo_dir)
            except Exception as exc:
                raise InfraError(f"could not copy repo_source into the fresh runtime: {exc}") from exc
        if config.get("rerun_prepare", not source):
            _prepare(ws, spec)
        yield ws
    finally:
        try:
            runtime.stop(handle)
        except Exception:
            pass
        if handle.backend == "local" and not config.get("keep_fresh"):
            shutil.rmtree(Path(handle.workdir), ignore_errors=True)


def _prepare(ws: Workspace, spec: RuntimeSpec) -> None:
    """The task's prepare steps, as the init stage runs them (write / upload / exec)."""
    for i, step in enumerate(spec.prepare):
        if "write" in step:
            ws.upload_text(step["write"].get("content", ""), step["write"]["path"])
        elif "upload" in step:
            src = Path(step["upload"]["src"])
            ws.runtime.upload(ws.handle, src, step["upload"].get("dst", src.name))
        else:
            refusal = refused_prepare(ws.handle, step, allow_local_exec_from_env())  # as init checks
            if refusal:
                raise InfraError(f"fresh runtime: prepare step {i} {refusal}")
            result = ws.run(step["exec"], f"prepare-{i}", timeout=step.get("timeout"))
            if result.exit_code != 0:
                raise InfraError(f"fresh runtime: prepare step {i} exited with {result.exit_code}: "
                                 f"{result.output_tail[-300:]}")


def _pathspecs(patterns: list[str] | tuple[str, ...]) -> str:
    return " ".join(shlex.quote(f":(exclude,glob){p}") for p in patterns)


def extract_diff(ws: Workspace, repo_dir: str = ".", base: str = "HEAD",
                 exclude: list[str] | tuple[str, ...] = (), git: str = "git") -> tuple[str, dict[str, Any]]:
    """The agent's changes as a unified diff against `base` (untracked files included, caches and
    binaries excluded). Returns (patch text, info)."""
    excl = _pathspecs(tuple(DEFAULT_EXCLUDES) + tuple(exclude))
    g = shlex.quote(git)
    script = f"""
d=$(mktemp -d) || exit 96
exec 2>"$d/err"
cd -- {shlex.quote(repo_dir)} || {{ echo "__POLAR_NO_REPO__"; exit {NO_REPO}; }}
command -v {g} >/dev/null 2>&1 || {{ echo "__POLAR_NO_GIT__"; exit {NO_GIT}; }}
{g} rev-parse --git-dir >/dev/null 2>&1 || {{ echo "__POLAR_NO_REPO__"; exit {NO_REPO}; }}
export GIT_INDEX_FILE="$d/index"
{g} read-tree {shlex.quote(base)} || {{ echo "__POLAR_BAD_BASE__"; cat "$d/err"; exit {BAD_BASE}; }}
excl=({excl})
{g} add -A -- . "${{excl[@]}}" >/dev/null || {{ cat "$d/err"; exit 93; }}
bins=()
while IFS=$'\\t' read -r a b path; do
  if [ "$a" = "-" ] && [ "$b" = "-" ]; then bins+=(":(exclude,literal)$path"); echo "__POLAR_BINARY__ $path"; fi
done < <({g} -c core.quotepath=off diff --cached --no-renames --numstat {shlex.quote(base)} -- . "${{excl[@]}}")
echo "__POLAR_DIFF_BEGIN__"
{g} -c core.quotepath=off diff --cached --no-renames --no-color --no-ext-diff --src-prefix=a/ --dst-prefix=b/ \\
  {shlex.quote(base)} -- . "${{excl[@]}}" "${{bins[@]}}"
rc=$?
echo "__POLAR_DIFF_END__"
cat "$d/err"
rm -rf "$d"
exit $rc
"""
    result = ws.run(script, "diff", timeout=300)
    out = ws.output(result)
    if result.exit_code == NO_GIT:
        raise InfraError(f"git ({git}) is not available in the session runtime")
    if result.exit_code == NO_REPO:
        raise InfraError(f"{repo_dir!r} is not a git repository in the session runtime")
    if result.exit_code == BAD_BASE:
        raise InfraError(f"base commit {base!r} not found in the session repository: {out[-300:]}")
    if result.exit_code != 0 or "__POLAR_DIFF_BEGIN__" not in out:
        raise InfraError(f"git diff failed (exit {result.exit_code}): {out[-500:]}")
    head, _, rest = out.partition("__POLAR_DIFF_BEGIN__\n")
    patch, _, _ = rest.rpartition("__POLAR_DIFF_END__")
    binaries = [line.split(" ", 1)[1] for line in head.splitlines() if line.startswith("__POLAR_BINARY__ ")]
    return patch, {"patch_bytes": len(patch.encode()), "files": patch_files(patch),
                   "binaries_excluded": binaries}


_PLUS_FILE = re.compile(r"^\+\+\+ (?:b/)?(\S+)", re.M)
_ESCAPES = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v", '"': '"', "\\": "\\"}


def _unquote(path: str) -> str:
    """A path as git prints it: C-quoted ("a\\tb", octal escapes for bytes) or plain."""
    if not (len(path) >= 2 and path[0] == path[-1] == '"'):
        return path
    body, out, i = path[1:-1], bytearray(), 0
    while i < len(body):
        ch = body[i]
        if ch == "\\" and i + 1 < len(body):
            nxt = body[i + 1]
            if nxt in "01234567" and i + 3 < len(body) + 1 and all(c in "01234567" for c in body[i + 1:i + 4]):
                out.append(int(body[i + 1:i + 4], 8))
                i += 4
                continue
            out += _ESCAPES.get(nxt, nxt).encode()
            i += 2
            continue
        out += ch.encode()
        i += 1
    return out.decode("utf-8", errors="surrogateescape")


def _header_path(line: str) -> str | None:
    """The path of a `diff --git a/P b/P` header (no renames: both sides name the same file)."""
    rest = line[len("diff --git "):].rstrip("\n")
    if rest.startswith('"'):
        m = re.match(r'("(?:[^"\\]|\\.)*")', rest)
        return _unquote(m.group(1))[2:] if m else None
    if rest.startswith("a/") and (len(rest) - 5) % 2 == 0:
        n = (len(rest) - 5) // 2
        a, b = rest[2:2 + n], rest[2 + n:]
        if b == " b/" + a:
            return a
    m = re.match(r"a/(\S+) b/(\S+)$", rest)
    return m.group(2) if m else None


def _chunk_path(chunk: str) -> str | None:
    """The path one file's part of a diff touches (its `+++`/`---` lines, else the header)."""
    plus = minus = None
    for line in chunk.splitlines():
        if line.startswith("+++ ") and plus is None:
            plus = line[4:].split("\t", 1)[0]
        elif line.startswith("--- ") and minus is None:
            minus = line[4:].split("\t", 1)[0]
        elif line.startswith("@@"):
            break
    for side, prefix in ((plus, "b/"), (minus, "a/")):
        if side and side != "/dev/null":
            side = _unquote(side)
            return side[len(prefix):] if side.startswith(prefix) else side
    return _header_path(chunk.split("\n", 1)[0]) if chunk.startswith("diff --git ") else None


def split_patch(patch: str) -> list[tuple[str | None, str]]:
    """A git diff split per file: [(path or None when unreadable, the file's part of the diff)].
    Text before the first `diff --git` header (a plain unified diff) is one part."""
    parts: list[str] = []
    for line in (patch or "").splitlines(keepends=True):
        if line.startswith("diff --git ") or not parts:
            parts.append(line)
        else:
            parts[-1] += line
    return [(_chunk_path(part), part) for part in parts if part.strip()]


def patch_files(patch: str) -> list[str]:
    """Paths a unified diff touches."""
    if "diff --git " not in (patch or ""):
        return list(dict.fromkeys(f for f in (m.group(1) for m in _PLUS_FILE.finditer(patch or ""))
                                  if f != "/dev/null"))
    return list(dict.fromkeys(path for path, _ in split_patch(patch) if path))


# Files that configure the test run (pytest's config files and plugins, Python start-up hooks):
# never taken from the agent's patch when grading in a fresh runtime.
TEST_CONFIG = re.compile(r"(^|/)(conftest\.py|\.?pytest\.ini|\.?pytest\.toml|tox\.ini|setup\.cfg|"
                         r"pyproject\.toml|sitecustomize\.py|usercustomize\.py|[^/]*\.pth)$")
TEST_DIR_NAMES = frozenset({"test", "tests", "testing"})


def _under(path: str, root: str) -> bool:
    root = root.strip("/")
    return root in ("", ".") or path == root or path.startswith(root + "/")


def test_dirs(protected: list[str]) -> list[str]:
    """The directories guarded for protected test paths: for each, its outermost ancestor named
    test / tests / testing (`sympy/core/tests/test_x.py` → `sympy/core/tests`, `tests/a/test_x.py`
    → `tests`). A test file outside such a directory (`test_x.py` at the root, `pkg/test_x.py`
    next to the code) guards only itself: its directory also holds the code being fixed."""
    dirs = []
    for path in protected:
        parts = path.strip("/").split("/")[:-1]
        for i, part in enumerate(parts):
            if part in TEST_DIR_NAMES:
                dirs.append("/".join(parts[:i + 1]))
                break
    return list(dict.fromkeys(dirs))


def guard_patch(patch: str, protected: list[str], exclude_test_config: bool = True
                ) -> tuple[str, list[str], list[str]]:
    """The part of the agent's patch a fresh runtime may apply: drops every file under a protected
    path or under a guarded test directory (`test_dirs`), and (with `exclude_test_config`) every
    test-configuration file anywhere (TEST_CONFIG: conftest.py, pytest.ini, tox.ini, setup.cfg,
    pyproject.toml, sitecustomize.py, usercustomize.py, *.pth). Whole files are dropped: pytest
    reads options (addopts -p plugin, ...) from any section of those files and they declare
    plugins and entry points, so no hunk of them is trusted. A part whose path cannot be read is
    dropped too. Returns (kept patch, excluded paths, guarded directories)."""
    guards = test_dirs(protected)
    roots = [p for p in list(protected) + guards if p.strip("/") not in ("", ".")]
    kept, excluded = [], []
    for path, part in split_patch(patch):
        if (path is None or any(_under(path, r) for r in roots)
                or (exclude_test_config and TEST_CONFIG.search(path))):
            excluded.append(path if path is not None else "<unreadable diff header>")
        else:
            kept.append(part)
    return "".join(kept), list(dict.fromkeys(excluded)), guards


def apply_patch(ws: Workspace, patch: str, repo_dir: str = ".", git: str = "git",
                patch_cmd: str = "patch") -> dict[str, Any]:
    """Apply a patch in the workspace: `git apply`, then `patch --fuzz=5`. Returns
    {"applied": bool, "method": "git"|"patch"|None, "output": tail}."""
    ws.upload_text(patch if patch.endswith("\n") else patch + "\n", f"{GRADE_DIR}/model.patch")
    g, p = shlex.quote(git), shlex.quote(patch_cmd)
    script = f"""
P="$PWD/{GRADE_DIR}/model.patch"
cd -- {shlex.quote(repo_dir)} || {{ echo "__POLAR_NO_REPO__"; exit {NO_REPO}; }}
command -v {g} >/dev/null 2>&1 || {{ echo "__POLAR_NO_GIT__"; exit {NO_GIT}; }}
if {g} apply --verbose --whitespace=nowarn "$P"; then echo "__POLAR_APPLIED__ git"; exit 0; fi
command -v {p} >/dev/null 2>&1 || {{ echo "__POLAR_NO_PATCH__"; exit {NO_PATCH}; }}
if {p} --batch --fuzz=5 -p1 -i "$P"; then echo "__POLAR_APPLIED__ patch"; exit 0; fi
echo "__POLAR_APPLY_FAILED__"
exit 1
"""
    result = ws.run(script, "apply", timeout=300)
    out = ws.output(result)
    if result.exit_code == NO_GIT:
        raise InfraError(f"git ({git}) is not available in the fresh runtime")
    if result.exit_code == NO_PATCH:
        raise InfraError(f"git apply failed and the fallback `{patch_cmd}` is not available: {out[-300:]}")
    if result.exit_code == NO_REPO:
        raise InfraError(f"{repo_dir!r} does not exist in the fresh runtime")
    method = None
    m = re.search(r"__POLAR_APPLIED__ (\w+)", out)
    if m:
        method = m.group(1)
    return {"applied": result.exit_code == 0 and method is not None, "method": method, "output": out[-2000:]}


def restore_paths(ws: Workspace, paths: list[str], repo_dir: str = ".", base: str = "HEAD",
                  git: str = "git") -> None:
    """Put `paths` (files or directories) back as they are at `base`; delete what the agent added
    under them. Never trusts the agent's copies of the tests."""
    if not paths:
        return
    g = shlex.quote(git)
    lines = [f"cd -- {shlex.quote(repo_dir)} || exit {NO_REPO}",
             f"command -v {g} >/dev/null 2>&1 || exit {NO_GIT}"]
    for path in paths:
        q = shlex.quote(path)
        spec = shlex.quote(f"{base}:{path.rstrip('/')}")
        lines.append(f"rm -rf -- {q}; if {g} cat-file -e {spec} 2>/dev/null; then "
                     f"{g} checkout {shlex.quote(base)} -- {q} || exit 1; fi")
    result = ws.run("\n".join(lines), "restore", timeout=300)
    if result.exit_code == NO_GIT:
        raise InfraError(f"git ({git}) is not available in the fresh runtime")
    if result.exit_code != 0:
        raise InfraError(f"could not restore protected paths {paths}: {result.output_tail[-300:]}")


def restore_dirs(ws: Workspace, dirs: list[str], repo_dir: str = ".", base: str = "HEAD",
                 git: str = "git") -> None:
    """Tracked files under `dirs` back as they are at `base` (nothing is deleted: the agent's
    files there were dropped from the patch, build outputs the image put there stay)."""
    if not dirs:
        return
    g = shlex.quote(git)
    lines = [f"cd -- {shlex.quote(repo_dir)} || exit {NO_REPO}",
             f"command -v {g} >/dev/null 2>&1 || exit {NO_GIT}"]
    for path in dirs:
        spec = shlex.quote(f"{base}:{path.rstrip('/')}")
        lines.append(f"if {g} cat-file -e {spec} 2>/dev/null; then "
                     f"{g} checkout {shlex.quote(base)} -- {shlex.quote(path)} || exit 1; fi")
    result = ws.run("\n".join(lines), "restore-dirs", timeout=300)
    if result.exit_code == NO_GIT:
        raise InfraError(f"git ({git}) is not available in the fresh runtime")
    if result.exit_code != 0:
        raise InfraError(f"could not restore test directories {dirs}: {result.output_tail[-300:]}")


def cleanup_scratch(ws: Workspace) -> None:
    try:
        ws.run(f"rm -rf -- {GRADE_DIR}", "cleanup", timeout=60, check_budget=False)
    except Exception:
        pass

