"""How the `local` runtime starts a command: a string command is no longer run by a login shell
(`bash -lc`), and a plain one (words without shell syntax, an executable first) is exec'd
directly. Either way the command gets the environment the runtime and the harness give it, runs
in the work dir, in its own process group, and dies with its worker (runtimes/local.py)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from polar_mq.runtimes.local import LocalRuntime, command_argv
from polar_mq.taskspec import RuntimeSpec

PATH = os.environ.get("PATH", "/usr/bin:/bin")

PROBE = """
import json, os, sys
print(json.dumps({"env": dict(os.environ), "cwd": os.getcwd(), "pid": os.getpid(),
                  "pgid": os.getpgid(0), "sid": os.getsid(0), "args": sys.argv[1:],
                  "parent": open(f"/proc/{os.getppid()}/comm").read().strip()}))
"""


@pytest.mark.parametrize("command, argv", [
    ("true", ["true"]),
    ("  sleep   0.1 ", ["sleep", "0.1"]),
    ("/usr/bin/env A=1 x", ["/usr/bin/env", "A=1", "x"]),
])
def test_plain_commands_are_execd_directly(command, argv):
    assert command_argv(command, PATH) == argv


@pytest.mark.parametrize("command", [
    "true x",            # bash's `true` ignores arguments, /usr/bin/true may not
    "echo hi", "exit 3", "cd / ", "export A=1",  # builtins
    "FOO=1 env",         # an assignment
    "ls $HOME", "ls *", "ls ~", "a && b", "a | b", "a > f", "a; b", "ls\nrm", "'q' x", "(ls)",
    "./relative.sh",     # a path relative to the work dir: bash resolves it there
    "no-such-command-here", "",
])
def test_shell_syntax_builtins_and_unknown_commands_go_through_bash_c(command):
    assert command_argv(command, PATH) == ["bash", "-c", command]  # not a login shell (-l)


def test_argv_commands_are_unchanged():
    assert command_argv(["bash", "-lc", "x"], PATH) == ["bash", "-lc", "x"]


def _run(tmp_path: Path, command: str, path: str) -> dict:
    runtime = LocalRuntime()
    handle = runtime.start(RuntimeSpec(env={"FROM_SPEC": "spec", "PATH": path}), tmp_path / "s", "sess-1")
    (Path(handle.workdir) / "probe.py").write_text(PROBE)
    started: list[dict] = []
    result = runtime.exec(handle, command, env={"FROM_HARNESS": "harness value"}, timeout=30,
                          log_path=tmp_path / "s" / "logs" / "h.log", on_start=started.append)
    assert result.exit_code == 0, result.output_tail
    out = json.loads(result.output_tail.strip().splitlines()[-1])
    out["on_start"] = started
    out["workdir"] = handle.workdir
    out["home"] = handle.home
    return out


@pytest.mark.parametrize("suffix, direct", [("probe.py a1 a2", True), ("probe.py a1 a2 && true", False)])
def test_string_command_gets_its_env_in_its_own_group(tmp_path, suffix, direct):
    # The PATH of the runtime's env (a directory /etc/profile would have dropped) is the one used.
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "probe-python").symlink_to(sys.executable)
    path = f"{bindir}:{PATH}"
    command = f"probe-python {suffix}"
    assert (command_argv(command, path)[0] != "bash") is direct
    out = _run(tmp_path, command, path)
    env = out["env"]
    assert env["FROM_SPEC"] == "spec" and env["FROM_HARNESS"] == "harness value"
    assert env["PATH"] == path and env["HOME"] == out["home"]
    assert env["PWD"] == out["workdir"] and out["cwd"] == out["workdir"]
    assert out["args"] == ["a1", "a2"]
    # Its own session and process group, and the group recorded for takeover/teardown is it.
    assert out["pgid"] == out["sid"] != os.getpgid(0)
    assert out["on_start"] == [{"pgid": out["pgid"]}]
    if direct:  # nothing between the setpriv wrapper (or the worker) and the command
        assert out["pgid"] == out["pid"]
    else:
        assert out["parent"] == "bash"


def test_login_profile_is_not_read(tmp_path):
    home_profile = "echo PROFILE-READ"  # a login shell would read $HOME/.profile (the session home)
    runtime = LocalRuntime()
    handle = runtime.start(RuntimeSpec(), tmp_path / "s", "sess-2")
    Path(handle.home, ".profile").write_text(home_profile + "\n")
    Path(handle.home, ".bash_profile").write_text(home_profile + "\n")
    result = runtime.exec(handle, "echo ran", env={}, timeout=30, log_path=tmp_path / "h.log")
    assert result.exit_code == 0
    assert "ran" in result.output_tail and "PROFILE-READ" not in result.output_tail


def test_exit_watch_waits_on_descriptors_past_1024() -> None:
    """The local runtime waits for a harness on a pidfd; with select.select a worker whose pidfd
    had a descriptor >= 1024 got ValueError instead of a wait."""
    import os
    import resource
    import subprocess
    import sys
    import time

    from polar_mq.runtimes.local import ExitWatch

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard < 2048:
        pytest.skip("the hard limit on open files is below 2048 here")
    if soft < 1200:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096), hard))
    filler = [os.dup(0) for _ in range(1100)]
    try:
        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.5)"])
        watch = ExitWatch(proc)
        assert watch.fd is None or watch.fd >= 1024
        t0 = time.monotonic()
        assert watch.wait(0.05) is False  # still running: waited, did not raise
        assert watch.wait(10) is True and time.monotonic() - t0 < 5
        watch.close()
    finally:
        for fd in filler:
            os.close(fd)
