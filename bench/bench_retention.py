"""What one janitor retention pass (store/retention.py `collect`) costs, in a private redis-server.

N finished tasks of S sessions each, shaped as the pipeline stores them (task record, sessions
list, session records, a group hash with `finished_at`, a gateway session per session with its
key mapping, a record and a chunk hash, in the sessions index), plus N orphan gateway sessions
(no task). Three passes are timed:
- nothing due (everything recent): the cost paid every POLAR_RETENTION_SWEEP_SECONDS;
- everything due: every task and orphan collected (keys deleted, indexes cleaned);
- the pass after that (empty indexes).

    .venv/bin/python bench/bench_retention.py [--tasks 2000] [--samples 4]
"""

from __future__ import annotations

import argparse
import time

from polar_mq.cli.embedded_redis import start_embedded
from polar_mq.model import SessionRecord
from polar_mq.store import retention
from polar_mq.store.core import GatewayStore, Keys, connect, pack


def populate(r, keys: Keys, tasks: int, samples: int, now: float) -> None:
    gw = GatewayStore(r, keys)
    pipe = r.pipeline(transaction=False)
    for t in range(tasks):
        tid = f"bench-{t}"
        sids = [f"{tid}-{i}" for i in range(samples)]
        pipe.set(keys.task(tid), pack({"spec": {}, "created_at": now}))
        pipe.rpush(keys.task_sessions(tid), *sids)
        pipe.zadd(keys.task_index(), {tid: now})
        pipe.hset(keys.group(tid), mapping={"finished_at": now, "delivery": 0})
        pipe.zadd(keys.groups_pending(), {tid: now})
        for sid in sids:
            rec = SessionRecord(session_id=sid, task_id=tid, state="COMPLETED", gateway_session_id=f"gw-{sid}")
            pipe.set(keys.session(sid), pack(rec.to_dict()))
        pipe.execute()
        for sid in sids:
            gw.create_session(f"gw-{sid}", tid)
            r.rpush(keys.calls(f"gw-{sid}"), b"x" * 200)
            r.hset(keys.call_chunks(f"gw-{sid}"), b"d", b"y" * 500)
        orphan = gw.create_session(f"orphan-{t}")[0]
        r.rpush(keys.calls(orphan.session_id), b"x" * 200)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tasks", type=int, default=2000)
    ap.add_argument("--samples", type=int, default=4)
    args = ap.parse_args()
    server = start_embedded()
    try:
        r, keys = connect(server.url), Keys()
        now = time.time()
        populate(r, keys, args.tasks, args.samples, now)
        n_keys = r.dbsize()
        t0 = time.perf_counter()
        idle = retention.collect(r, keys, retention=3600, now=now + 1)
        t1 = time.perf_counter()
        due = retention.collect(r, keys, retention=3600, now=now + 7200, session_limit=10**9)
        t2 = time.perf_counter()
        after = retention.collect(r, keys, retention=3600, now=now + 7200)
        t3 = time.perf_counter()
        assert not idle.tasks and not idle.sessions and not after.tasks and not after.sessions
        assert len(due.tasks) == args.tasks and len(due.sessions) == args.tasks, due.to_dict()
        left = r.dbsize()
        print(f"retention pass: {args.tasks} tasks x {args.samples} sessions + {args.tasks} orphan sessions "
              f"({n_keys} keys): nothing due {1000 * (t1 - t0):.0f} ms; all due {1000 * (t2 - t1):.0f} ms "
              f"({due.keys} keys deleted, {left} left); next pass {1000 * (t3 - t2):.0f} ms")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
