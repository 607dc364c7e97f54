"""The bwrap runtime: a session runs in a bubblewrap sandbox (read-only host, private /tmp and
network, writable session dir, the gateway bridged onto the sandbox's loopback)."""

from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path

import pytest

from tests.support.pipeline import agent_task, make_pipeline
from polar_mq import states
from polar_mq.runtimes.bwrap import BwrapRuntime
from polar_mq.taskspec import RuntimeSpec

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None,
                                reason="bubblewrap not installed (apt-get install bubblewrap)")

PROBE = r"""
import os, socket, sys, urllib.request
from pathlib import Path
Path("in-work.txt").write_text("ok")
for target in sys.argv[2:]:
    try:
        Path(target).write_text("escaped")
        print("WROTE", target)
    except OSError as exc:
        print("denied", target, exc.errno)
Path("/tmp/private.txt").write_text("tmp")
print("gateway", urllib.request.urlopen(sys.argv[1] + "/s/x", timeout=5).status)
try:
    socket.create_connection(("1.1.1.1", 80), 3)
    print("INTERNET")
except OSError as exc:
    print("no internet", exc.errno)
"""


def test_sandbox_can_write_only_its_session_dir(gateway, tmp_path):
    rt = BwrapRuntime()
    handle = rt.start(RuntimeSpec(backend="bwrap"), tmp_path / "s", "sess-bw")
    outside = [str(tmp_path / "outside.txt"), str(ROOT / "bwrap-escape.txt"), "/root/bwrap-escape.txt"]
    handle = handle.updated(gateway_urls=[gateway.url + "/s/x"])
    r = rt.exec(handle, [sys.executable, "-c", PROBE, gateway.url, *outside], env={}, timeout=30,
                log_path=tmp_path / "s" / "logs" / "probe.log")
    out = r.output_tail
    assert r.exit_code == 0, out
    assert (tmp_path / "s" / "work" / "in-work.txt").read_text() == "ok"
    # read-only host (the repo, /root); the sibling under /tmp lands in the sandbox's own /tmp.
    # The read-only bind answers EROFS (30); for a non-root user the host's own permissions
    # (/root is 0700) may refuse first with EACCES (13). Either way nothing is written.
    for target in outside[1:]:
        assert f"denied {target} 30" in out or f"denied {target} 13" in out, out
    # os.path.exists, not Path.exists: a non-root user may not even stat inside /root (EACCES)
    assert not any(os.path.exists(p) for p in outside)
    assert not Path("/tmp/private.txt").exists()  # the sandbox's /tmp is its own
    assert "gateway 200" in out and "no internet" in out and "INTERNET" not in out, out


def test_timeout_kills_the_sandbox_and_keeps_output(tmp_path):
    rt = BwrapRuntime()
    handle = rt.start(RuntimeSpec(backend="bwrap"), tmp_path / "s", "sess-bw2")
    marker = tmp_path / "s" / "alive"
    t0 = time.time()
    r = rt.exec(handle, f"echo before; (sleep 3; touch {marker}) & sleep 300", env={}, timeout=1,
                log_path=tmp_path / "s" / "logs" / "t.log")
    assert r.timed_out and time.time() - t0 < 10
    assert "before" in r.output_tail
    time.sleep(3.5)
    assert not marker.exists()  # the background child died with the sandbox


def test_session_runs_in_the_sandbox(gateway, tmp_path):
    p = make_pipeline(gateway, tmp_path)
    try:
        p.start_worker("init", 1)
        p.start_worker("run", 1)
        p.start_worker("postrun", 1)
        escape = ROOT / f"escape-{tmp_path.name}.txt"  # host, read-only in the sandbox
        cmd = (f"{sys.executable} {ROOT / 'examples' / 'tiny_agent.py'} && "
               f"(echo x > {escape} || echo cannot-escape)")
        _, [sid] = p.submit(agent_task(num_samples=1, runtime={"backend": "bwrap", "prepare": [
            {"write": {"path": "notes/readme.txt", "content": "prepared"}}]},
            agent={"harness": "shell", "options": {"command": cmd}}))
        [rec] = p.wait([sid], timeout=90)
        assert rec.state == states.COMPLETED, (rec.state, rec.error)
        assert Path(rec.runtime.workdir, "polar.txt").read_text() == "hello from polar"
        assert Path(rec.runtime.workdir, "notes", "readme.txt").read_text() == "prepared"
        assert not escape.exists()
        log = Path(rec.runtime.session_dir, "logs", "harness-0.log").read_text()
        assert "cannot-escape" in log
        traj = p.store.get_trajectory(sid)
        assert traj.stats["calls"] == 2 and traj.stats["traces"] == 1
    finally:
        p.stop()
