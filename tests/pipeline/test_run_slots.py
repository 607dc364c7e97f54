"""Run slots that cost kilobytes: hundreds of sessions held by one worker process (the default
threads pool, polar_mq/cli/slots.py), all COMPLETED, in bounded supervisor memory; harnesses forked
from a long-lived thread so "dies with the worker" (PR_SET_PDEATHSIG) means the process."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from tests.support.pipeline import make_pipeline
from tests.support.procmem import pool_pids, pss_mib
from polar_mq import states
from polar_mq.cli import slots
from polar_mq.runtimes import orphans
from polar_mq.runtimes.local import spawn_args, spawner

SESSIONS = 256
# One chat call through the gateway (the session's key), then a wait that keeps the slot held so
# the sessions overlap: the pool holds many harnesses at once, not one after another. curl -f:
# a refused call fails the session, so COMPLETED means the call went through the gateway.
CHEAP_AGENT = ('curl -sf -o /dev/null -H "Authorization: Bearer $OPENAI_API_KEY" '
               '-H "Content-Type: application/json" '
               '-d \'{"model":"policy","messages":[{"role":"user","content":"say hi"}],"max_tokens":8}\' '
               '"$OPENAI_BASE_URL/chat/completions" && sleep 10')


def test_host_sizing() -> None:
    small, big = slots.Host(cores=2, memory_gib=4.0), slots.Host(cores=64, memory_gib=512.0)
    assert slots.concurrency_for("run", "threads", small) == 64  # 16 per GiB
    assert slots.concurrency_for("run", "threads", slots.Host(2, 0.25)) == 8  # the floor
    assert slots.concurrency_for("run", "threads", big) == 256  # the cap
    assert slots.concurrency_for("init", "threads", small) == 8
    assert slots.concurrency_for("postrun", "threads", big) == 32
    assert slots.concurrency_for("run", "prefork", small) == 4
    assert slots.concurrency_for("run", "prefork", big) == 64
    assert slots.sizing("run", {}, small) == ("threads", 64, "sized from the host (2 cores, 4.0 GiB)")
    assert slots.sizing("run", {"POLAR_CELERY_POOL": "prefork", "POLAR_RUN_CONCURRENCY": "3"}, small)[:2] == \
        ("prefork", 3)
    assert slots.sizing("postrun", {"POLAR_CELERY_POOL": "threads", "POLAR_POSTRUN_POOL": "prefork"},
                        small)[0] == "prefork"
    h = slots.host()
    assert h.cores >= 1 and h.memory_gib > 0.1


def test_fd_limit_is_raised_for_the_slots() -> None:
    """One process holds every slot's pipe, pidfd and log: its soft open-files limit is raised
    (toward the hard limit) to fit them; checked in a child so this process keeps its own."""
    probe = ("import resource; from polar_mq import slots\n"
             "s, h = resource.getrlimit(resource.RLIMIT_NOFILE)\n"
             "resource.setrlimit(resource.RLIMIT_NOFILE, (1024 if h < 0 else min(1024, h), h))\n"
             "before, after = slots.raise_fd_limit(256)\n"
             "print(before, after, resource.getrlimit(resource.RLIMIT_NOFILE)[0], h)")
    before, after, now, hard = map(int, subprocess.run([sys.executable, "-c", probe], capture_output=True,
                                                       text=True, check=True).stdout.split())
    want = 256 + slots.FDS_PER_SLOT * 256  # RLIM_INFINITY is -1
    assert before == (1024 if hard < 0 else min(1024, hard)) and now == after
    assert after == (want if hard < 0 else min(hard, want))


def _alive(pid: int) -> bool:
    return orphans._start_time(pid) is not None


def _spawn_from_short_thread(via_spawner: bool) -> subprocess.Popen:
    argv, preexec = spawn_args(["sleep", "30"])
    box: list[subprocess.Popen] = []

    def start() -> None:
        def popen() -> subprocess.Popen:
            return subprocess.Popen(argv, preexec_fn=preexec, start_new_session=True)
        proc = spawner.call(popen) if via_spawner else popen()
        box.append(proc)
        # setpriv sets the death signal, then execs: end this thread only once `sleep` runs, or
        # the thread could be gone before there was a signal to send
        deadline = time.time() + 10
        while b"sleep" not in Path(f"/proc/{proc.pid}/comm").read_bytes() and time.time() < deadline:
            time.sleep(0.005)

    t = threading.Thread(target=start)
    t.start()
    t.join()  # the thread that asked for the harness has ended
    return box[0]


def test_harness_outlives_the_thread_that_asked_for_it() -> None:
    """A death signal set in a child is tied to the thread that forked it: started straight from a
    pool thread that then ends, the harness is killed; through the spawner it lives on."""
    direct = _spawn_from_short_thread(via_spawner=False)
    kept = _spawn_from_short_thread(via_spawner=True)
    try:
        direct.wait(timeout=5)  # the Linux behaviour the spawner exists for
        assert direct.returncode == -9
        time.sleep(0.3)
        assert kept.poll() is None and _alive(kept.pid)
    finally:
        kept.kill()
        kept.wait()


def test_pool_pids_and_pss() -> None:
    """The pool is the main process and its forks (same cmdline), not the harnesses it started;
    its PSS is counted once per page (tests/support/procmem.py, which bench/bench_soak.py uses too)."""
    prog = ("import os, subprocess, time\n"
            "h = subprocess.Popen(['sleep', '30'])\n"
            "if os.fork() == 0:\n    time.sleep(30); os._exit(0)\n"
            "print(h.pid, flush=True); time.sleep(30)")
    main = subprocess.Popen([sys.executable, "-c", prog], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        harness = int(main.stdout.readline())
        deadline = time.time() + 10
        while len(pool_pids(main.pid)) < 2 and time.time() < deadline:
            time.sleep(0.05)
        pids = pool_pids(main.pid)
        assert len(pids) == 2 and pids[0] == main.pid and harness not in pids, (pids, harness)
        both, alone = pss_mib(pids), pss_mib(pids[:1])
        assert 0 < alone < both < 2 * alone  # the fork shares the interpreter's pages
        assert pss_mib([2 ** 22 + 1]) == 0  # a pid that is gone counts 0
    finally:
        os.killpg(main.pid, 9)
        main.wait()


def test_256_sessions_in_one_worker_process_with_bounded_memory(gateway, tmp_path) -> None:
    """256 sessions of a cheap shell agent (one gateway call each, then a wait) on one host with
    the default pool: all COMPLETED, at least a quarter of them held at once, and the whole run pool's
    PSS (smaps_rollup of its processes) under 400 MiB — prefork needed ~38 MiB per slot."""
    p = make_pipeline(gateway, tmp_path, POLAR_READY_CAPACITY="64", POLAR_KEEP_WORKDIRS="0")
    assert "POLAR_CELERY_POOL" not in p.env and "POLAR_CELERY_POOL" not in os.environ  # the default pool
    try:
        p.start_worker("init", concurrency=16)
        run = p.start_worker("run", concurrency=SESSIONS)
        p.start_worker("postrun", concurrency=8)
        t0 = time.time()
        _, sids = p.submit({"instruction": "say hi", "num_samples": SESSIONS, "timeout_seconds": 240,
                            "agent": {"harness": "shell", "model": "policy",
                                      "options": {"command": CHEAP_AGENT}},
                            "runtime": {"backend": "local"}, "builder": {"strategy": "prefix_merging"}})
        store = p.store
        peak_pss = peak_running = 0.0
        pool_sizes = set()
        deadline = time.time() + 300
        while time.time() < deadline:
            pids = pool_pids(run.pid)
            pool_sizes.add(len(pids))
            peak_pss = max(peak_pss, pss_mib(pids))
            recs = store.get_sessions(sids)
            peak_running = max(peak_running, sum(r.state == states.RUNNING for r in recs))
            if all(states.is_terminal(r.state) for r in recs):
                break
            time.sleep(0.5)
        recs = p.wait(sids, timeout=30)
        elapsed = time.time() - t0
        outcomes = {}
        for r in recs:
            outcomes[r.state] = outcomes.get(r.state, 0) + 1
        errors = [(r.session_id, r.error) for r in recs if r.state != states.COMPLETED][:5]
        print(f"\n{SESSIONS} sessions in {elapsed:.1f} s; run pool: {max(pool_sizes)} process(es), peak PSS "
              f"{peak_pss:.1f} MiB ({peak_pss * 1024 / SESSIONS:.0f} KiB per slot); peak RUNNING "
              f"{peak_running:.0f}")
        assert outcomes == {states.COMPLETED: SESSIONS}, (outcomes, errors)
        assert max(pool_sizes) == 1  # every slot in the worker's own process
        # held at once, not one after another (prefork's default on this host: 4 slots)
        assert peak_running >= SESSIONS // 4
        assert 0 < peak_pss < 400, peak_pss
    finally:
        p.stop()
