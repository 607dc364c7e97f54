"""`polar-mq up` keeps its data and takes its processes with it.

A task submitted to `up`, `up` killed with -9: after 5 s no process it started is left (and the
same ports serve the next `up`); the next `up` on the same POLAR_HOME has the task, its
trajectories and its group; so does one after a clean stop (SIGTERM); `--fresh` starts empty."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from tests.support.servers import ROOT, wait_http
from tests.support.pipeline import TINY_AGENT
from polar_mq.client import Client
from polar_mq.cli.embedded_redis import free_port
from polar_mq._io.supervise import start_time

TOKEN = "pmqt-durable-test-token-0123456789"


def descendants(pid: int) -> set[int]:
    """Every live process below `pid` (by parent links in /proc)."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                raw = Path(f"/proc/{entry}/stat").read_text()
                parents[int(entry)] = int(raw[raw.rindex(")") + 2:].split()[1])
            except (OSError, ValueError):
                continue
    out, todo = set(), [pid]
    while todo:
        p = todo.pop()
        kids = [c for c, pp in parents.items() if pp == p]
        out.update(kids)
        todo.extend(kids)
    return {p for p in out if start_time(p) is not None}


class Up:
    def __init__(self, tmp: Path, home: Path, api_port: int, gw_port: int):
        self.tmp, self.home, self.api_port, self.gw_port = tmp, home, api_port, gw_port
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    def start(self, *extra: str) -> Client:
        env = {**os.environ, "POLAR_REDIS_URL": "", "POLAR_HOME": str(self.home),
               "POLAR_LOG_DIR": str(self.tmp / f"logs{self.starts}"),
               "POLAR_SESSIONS_DIR": str(self.tmp / "sessions"), "POLAR_RESULTS_DIR": str(self.tmp / "results"),
               "POLAR_API_TOKEN": TOKEN, "POLAR_GATEWAY_TOKEN": TOKEN}
        self.starts += 1
        self.out = open(self.tmp / f"up{self.starts}.out", "wb")
        self.proc = subprocess.Popen([sys.executable, "-m", "polar_mq.cli", "up", "--api-port", str(self.api_port),
                                      "--gateway-port", str(self.gw_port), "--no-flower", "--init-concurrency", "1",
                                      "--run-concurrency", "2", "--postrun-concurrency", "1", *extra],
                                     stdout=self.out, stderr=subprocess.STDOUT, env=env, cwd=ROOT,
                                     start_new_session=True)
        wait_http(f"http://127.0.0.1:{self.api_port}/health", self.proc, timeout=120)
        deadline = time.time() + 60  # `up` says so once it watches (its SIGTERM handler set)
        while "polar_mq is up" not in self.output() and time.time() < deadline:
            time.sleep(0.1)
        return Client(f"http://127.0.0.1:{self.api_port}", token=TOKEN)

    def output(self) -> str:
        return (self.tmp / f"up{self.starts}.out").read_text(errors="replace")

    def kill9(self) -> tuple[set[int], float]:
        """kill -9 of `up` alone; (its processes, seconds until none of them is left)."""
        assert self.proc is not None
        procs = descendants(self.proc.pid)
        assert len(procs) >= 6, procs  # redis, stand-in, gateway, API, three pools (and their children)
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        t0 = time.time()
        while time.time() - t0 < 10 and any(start_time(p) is not None for p in procs):
            time.sleep(0.05)
        return {p for p in procs if start_time(p) is not None}, time.time() - t0

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def test_up_keeps_its_data_and_dies_with_its_processes(tmp_path):
    up = Up(tmp_path, tmp_path / "home", free_port(), free_port())
    try:
        client = up.start()
        sub = client.submit({"instruction": "Write hello into polar.txt", "num_samples": 2,
                             "agent": {"harness": "shell", "options": {"command": [sys.executable, str(TINY_AGENT)]}}})
        task_id = sub["task_id"]
        assert [s["state"] for s in client.wait(task_id, timeout=120)["sessions"]] == ["COMPLETED"] * 2
        time.sleep(1.5)  # appendfsync everysec: the last second's writes reach the file

        left, took = up.kill9()
        assert not left, f"still running {took:.1f} s after kill -9 of up: {left}"
        print(f"\nkill -9 of polar-mq up: its processes gone after {took:.2f} s")
        for port in (up.api_port, up.gw_port):
            with pytest.raises(requests.ConnectionError):
                requests.get(f"http://127.0.0.1:{port}/health", timeout=2)

        def same_task(c: Client) -> None:
            status = c.status(task_id)
            assert [s["state"] for s in status["sessions"]] == ["COMPLETED"] * 2, status
            results = c.results(task_id)
            assert len(results["trajectories"]) == 2
            assert all(t["stats"]["calls"] >= 1 for t in results["trajectories"])

        client = up.start()  # the same ports: nothing of the killed `up` holds them
        same_task(client)
        assert "previous `polar-mq up`" not in up.output()  # the parent-death signal did it all

        up.stop()  # a clean stop, then again
        assert up.proc is not None and up.proc.returncode == 0, up.output()[-3000:]
        client = up.start()
        same_task(client)
        up.stop()

        client = up.start("--fresh")
        resp = requests.get(f"http://127.0.0.1:{up.api_port}/v1/tasks/{task_id}",
                            headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10)
        assert resp.status_code == 404, resp.text
    finally:
        up.stop()


def test_a_second_up_on_the_same_home_is_refused_and_leftovers_are_ended(tmp_path):
    """The lock: a second `up` on a home in use exits 2 naming the first; a process group the
    list names that outlived its `up` is ended by the next one."""
    from polar_mq._io.supervise import UpLock

    home = tmp_path / "home"
    first = UpLock(home)
    first.acquire()
    leftover = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        first.add_child("stray", leftover.pid)
        out = subprocess.run([sys.executable, "-m", "polar_mq.cli", "up", "--no-flower"], capture_output=True,
                             text=True, env={**os.environ, "POLAR_HOME": str(home)}, cwd=ROOT, timeout=60)
        assert out.returncode == 2 and str(os.getpid()) in out.stderr, out.stderr
        first._fh.close()  # as if the first `up` died: the kernel drops its lock
        first._fh = None
        second = UpLock(home)
        second.acquire()
        assert second.end_leftovers(grace=5) == 1
        assert leftover.wait(timeout=5) == -signal.SIGTERM
        second.release()
    finally:
        if leftover.poll() is None:
            leftover.kill()
            leftover.wait()
