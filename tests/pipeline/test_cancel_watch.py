"""The cancel flag's poll (tasks/worker/cancel_watch.py): the sessions of one task held by one
process share one read per poll pass instead of one Redis read each, and every one of them still
sees the cancel."""

from __future__ import annotations

import threading
import time

from polar_mq.tasks.worker.cancel_watch import CancelWatch


def test_watches_of_one_task_share_a_read_and_all_see_the_cancel() -> None:
    reads = {"a": 0, "b": 0}
    flag = {"a": False, "b": False}
    lock = threading.Lock()

    def check(task: str):
        def read() -> bool:
            with lock:
                reads[task] += 1
            return flag[task]
        return read

    watches = [CancelWatch(check("a"), interval=0.2, key=("store", "a")) for _ in range(100)]
    other = [CancelWatch(check("b"), interval=0.2, key=("store", "b")) for _ in range(10)]
    alone = CancelWatch(check("b"), interval=0.2)  # no key: reads on its own
    for w in [*watches, *other, alone]:
        w.__enter__()
    try:
        time.sleep(1.1)  # ~5 passes
        with lock:
            a, b = reads["a"], reads["b"]
        # one read per pass for the 100 watches of task a (not ~500); b: its shared read + alone's
        assert 3 <= a <= 12, a
        assert 6 <= b <= 24, b
        assert not any(w.cancelled.is_set() for w in [*watches, *other, alone])
        flag["a"] = True
        deadline = time.time() + 2
        while not all(w.cancelled.is_set() for w in watches) and time.time() < deadline:
            time.sleep(0.02)
        assert all(w.cancelled.is_set() for w in watches)
        assert not any(w.cancelled.is_set() for w in [*other, alone])  # another task's flag is its own
        flag["b"] = True
        deadline = time.time() + 2
        while not all(w.cancelled.is_set() for w in [*other, alone]) and time.time() < deadline:
            time.sleep(0.02)
        assert all(w.cancelled.is_set() for w in [*other, alone])
    finally:
        for w in [*watches, *other, alone]:
            w.__exit__(None, None, None)
