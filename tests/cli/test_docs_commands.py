"""Every documented command works as written: each `polar-mq ...` command line of README.md and
docs/*.md parses with the real command-line parser (notation such as `[--opt X]`, `a|b` and
upper-case placeholders expanded into the forms it stands for), each documented sub-command's
`--help` runs for real, the cheap commands run for real, each `make TARGET` the README names
exists, and the First-hour dataset and template build valid tasks."""

from __future__ import annotations

import itertools
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.servers import ROOT

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PLACEHOLDER = re.compile(r"^(?:[A-Z][A-Z0-9_]*|<[^>]+>)$")  # FILE, TASK_ID, N, <id>


def _spans(text: str) -> list[str]:
    """`polar-mq ...` in inline code and in fenced blocks (continuation lines joined)."""
    found = []
    in_block = False
    block: list[str] = []
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            if in_block:
                joined = "\n".join(block).replace("\\\n", " ")
                found += [ln.strip() for ln in joined.splitlines() if ln.strip().startswith("polar-mq ")]
            in_block, block = not in_block, []
            continue
        if in_block:
            block.append(line)
    # inline spans may wrap a line in the Markdown source
    for span in re.findall(r"(?<!`)`(polar-mq [^`]+)`(?!`)", text.replace("\n", " ")):
        found.append(re.sub(r"\s+", " ", span).strip())
    return found


def documented() -> list[tuple[str, str]]:
    out = []
    for doc in DOCS:
        for cmd in _spans(doc.read_text()):
            cmd = cmd.split(" #", 1)[0].strip()  # a trailing shell comment
            cmd = re.sub(r"\s*[|&]{2}.*$|\s+[|>].*$", "", cmd) if " | " in cmd or "&&" in cmd or " > " in cmd else cmd
            out.append((doc.name, cmd))
    return out


def _strip_optional(text: str, keep: bool) -> str:
    """[...] groups (innermost first): dropped, or kept without the brackets."""
    while True:
        new = re.sub(r"\[([^\[\]]*)\]", (lambda m: m.group(1)) if keep else "", text)
        if new == text:
            return re.sub(r"\s+", " ", new).strip()
        text = new


def variants(cmd: str) -> list[list[str]]:
    """The concrete command lines a documented one stands for."""
    cmd = cmd.replace("…", "").replace("...", " ")
    forms = []
    for keep in (False, True):
        try:
            words = shlex.split(_strip_optional(cmd, keep))
        except ValueError:
            words = _strip_optional(cmd, keep).split()
        words = [w for w in words if w]
        # `a|b` alternatives; `submit/status/results` lists sub-commands the same way
        alternatives = [w.split("|") if "|" in w and not w.startswith(("http", "'")) else
                        w.split("/") if i == 1 and "/" in w else [w] for i, w in enumerate(words)]
        # each alternative of each word once (the others at their first), not the whole product
        base = [a[0] for a in alternatives]
        forms.append(base)
        for i, alts in enumerate(alternatives):
            for alt in alts[1:]:
                forms.append(base[:i] + [alt] + base[i + 1:])
    concrete = []
    for form in forms:
        argv = ["1" if PLACEHOLDER.match(w) and i > 0 else w for i, w in enumerate(form[1:])]
        argv = [a for a in argv if a]
        if len(argv) == 1:  # a mention of the sub-command (`polar-mq worker`): its --help
            argv.append("--help")
        if argv not in concrete:
            concrete.append(argv)
    return concrete


def check_parses(argv: list[str]) -> str | None:
    """None when the real parser accepts `polar-mq ARGV` (a placeholder given to an option with
    choices takes its first choice), else its complaint."""
    import contextlib
    import io

    for _ in range(6):
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            why = _parse(argv)
        choice = re.search(r"invalid choice: '1' \(choose from '?([^',)]+)", err.getvalue())
        if why is None or choice is None or "1" not in argv:
            return None if why is None else f"{why}: {err.getvalue()[-300:]}"
        argv = list(argv)
        argv[argv.index("1")] = choice.group(1)
    return why


def _parse(argv: list[str]) -> str | None:
    from polar_mq.cli import commands as cli

    try:
        through = cli._pass_through(argv)
        if through is not None and through.command == "model-server":
            from polar_mq.dev.model_server.__main__ import build_parser

            build_parser().parse_args(through.rest)
        elif through is not None:  # harness: [install|list|path] NAME...|all
            from polar_mq.harnesses import install

            rest = [a for a in through.rest if not a.startswith("-")]
            if rest and rest[0] in ("install", "list", "path"):
                rest = rest[1:]
            for name in rest:
                if name != "all" and name != "1":
                    install._package(name)
        else:
            cli.build_parser().parse_args(argv)
    except SystemExit as exc:
        return None if exc.code == 0 else f"exit {exc.code}"  # 0: --help
    except ValueError as exc:
        return str(exc)
    return None


COMMANDS = documented()


def test_the_docs_have_commands():
    assert len(COMMANDS) >= 30, COMMANDS
    assert any("demo --harness" in c for _, c in COMMANDS) and any("model-server --port" in c for _, c in COMMANDS)


@pytest.mark.parametrize("doc, cmd", COMMANDS, ids=[f"{d}:{c[:60]}" for d, c in COMMANDS])
def test_documented_command_parses(doc, cmd):
    forms = variants(cmd)
    failures = {" ".join(f): why for f in forms if (why := check_parses(f)) is not None}
    # a notation expanded into a form the author did not mean (e.g. two exclusive options) is fine
    # as long as one form of every documented line parses
    assert len(failures) < len(forms), (doc, cmd, failures)


def run_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "polar_mq.cli", *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=timeout, env={**os.environ})


def test_every_documented_subcommand_help_runs():
    subs = sorted({variants(c)[0][0] for _, c in COMMANDS if variants(c)[0]})
    assert {"demo", "up", "model-server", "submit", "groups"} <= set(subs), subs
    for sub in subs:
        r = run_cli(sub, "--help")
        assert r.returncode == 0 and f"usage: polar-mq {sub}" in r.stdout, (sub, r.stdout[-500:], r.stderr[-1000:])


def test_cheap_documented_commands_run_for_real():
    """The ones that need no deployment: the token (printed, then its path), the harness list."""
    texts = " ".join(c for _, c in COMMANDS)
    for cmd in ("polar-mq token", "polar-mq token --path", "polar-mq harness list"):
        assert cmd in texts
    token = run_cli("token")  # the test run's token (conftest sets POLAR_API_TOKEN)
    assert token.returncode == 0 and token.stdout.strip() == os.environ["POLAR_API_TOKEN"]
    path = run_cli("token", "--path")
    assert path.returncode == 0 and path.stdout.strip() == str(Path(os.environ["POLAR_HOME"]) / "token")
    listed = run_cli("harness", "list")
    assert listed.returncode == 0 and all(h in listed.stdout for h in ("claude_code", "codex", "pi"))


def test_documented_make_targets_exist():
    readme = (ROOT / "README.md").read_text()
    targets = set(re.findall(r"`make ([a-z][\w-]*)", readme)) | set(re.findall(r"^make ([a-z][\w-]*)", readme, re.M))
    assert {"demo", "test", "test-full"} <= targets, targets
    for target in sorted(targets):
        r = subprocess.run(["make", "-n", target, "KEEP=1"], cwd=ROOT, capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, (target, r.stderr)
    assert "polar-mq demo --keep" in subprocess.run(["make", "-n", "demo", "KEEP=1"], cwd=ROOT, capture_output=True,
                                                    text=True, timeout=30).stdout
    assert ".ci/run" in subprocess.run(["make", "-n", "test-full"], cwd=ROOT, capture_output=True, text=True,
                                       timeout=30).stdout


def test_first_hour_dataset_builds_tasks():
    from polar_mq.rl.datasets.build import TaskOptions
    from polar_mq.rl.datasets.build import build_tasks
    from polar_mq.rl.datasets.build import load_template
    from polar_mq.rl.datasets.readers import load_rows

    built = build_tasks(load_rows(ROOT / "examples/first_hour/rows.jsonl"),
                        load_template(ROOT / "examples/first_hour/task.yaml"), TaskOptions(samples=2))
    assert [b.error for b in built] == [None, None, None]
    assert all(b.task and b.task["agent"]["harness"] == "claude_code" and b.task["num_samples"] == 2 for b in built)
    assert "runtime" not in (ROOT / "examples/first_hour/task.yaml").read_text().split("#")[-1]
