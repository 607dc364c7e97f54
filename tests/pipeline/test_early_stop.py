"""Early stop through the real API process, real Celery worker pools and real Redis: a task whose
sessions have very different lengths is handed to the trainer once enough of them are usable, the
stragglers cancelled as DELETE cancels them, their partial trajectories kept and labelled."""

from __future__ import annotations

import sys
import time

import pytest

from tests.support.servers import stop
from tests.support.pipeline import TINY_AGENT, running_pipeline
from polar_mq.client import ApiError, Client
from tests.api.test_api import start_api

SLOW = 300  # seconds a straggler would take: far beyond what the test waits


@pytest.fixture(scope="module")
def pipeline(gateway, tmp_path_factory):
    yield from running_pipeline(gateway, tmp_path_factory, "early-stop", init=2, run=4, postrun=1,
                                POLAR_READY_CAPACITY="4")


@pytest.fixture(scope="module")
def client(pipeline, log_dir):
    server = start_api(log_dir, pipeline.redis_url, name="api-early-stop")
    yield Client(server.url, token="")
    stop(server.proc)


def straggler_task(task_id: str, **over):
    """Sessions 0 and 1 answer at once; 2 and 3 make their model calls, then hang for SLOW s."""
    command = (f"{sys.executable} {TINY_AGENT} && "
               f"case \"$POLAR_SESSION_ID\" in *-[23]-*) sleep {SLOW};; esac")
    body = {"task_id": task_id, "instruction": "Write hello into polar.txt", "num_samples": 4,
            "timeout_seconds": 600, "agent": {"harness": "shell", "options": {"command": command}},
            "runtime": {"backend": "local"}, "builder": {"strategy": "prefix_merging"}}
    body.update(over)
    return body


def test_group_arrives_once_enough_are_usable_and_nothing_is_lost(client, pipeline):
    t0 = time.time()
    sub = client.submit(straggler_task("es-stragglers", early_stop_min_usable_sessions=2))
    assert len(sub["session_ids"]) == 4
    groups = client.next_groups(limit=1, wait=120, lease=60)
    waited = time.time() - t0
    assert groups, "no group within 120 s: the stragglers were not stopped"
    group = groups[0]
    assert group["task_id"] == "es-stragglers"
    assert waited < SLOW / 3, waited

    by_sid = {s["session_id"]: s for s in group["sessions"]}
    quick = [s for sid, s in by_sid.items() if sid.split("-")[-2] in ("0", "1")]
    slow = [s for sid, s in by_sid.items() if sid.split("-")[-2] in ("2", "3")]
    assert [s["state"] for s in quick] == ["COMPLETED", "COMPLETED"], group["sessions"]
    # Cancelled exactly as DELETE cancels: ERROR with the error "cancelled", and labelled.
    assert [(s["state"], s["error"], s["early_stopped"]) for s in slow] == [("ERROR", "cancelled", True)] * 2
    assert all(not s["early_stopped"] for s in quick)
    assert group["early_stopped"] == 2

    # Nothing lost: every session has its trajectory; the stopped ones keep the calls they made.
    trajs = {t["session_id"]: t for t in group["trajectories"]}
    assert set(trajs) == set(by_sid)
    for s in slow:
        t = trajs[s["session_id"]]
        assert t["metadata"]["early_stopped"] is True and t["status"] == "ERROR"
        assert t["stats"]["calls"] >= 1 and t["traces"], t["stats"]
    for s in quick:
        assert "early_stopped" not in trajs[s["session_id"]]["metadata"]
        assert trajs[s["session_id"]]["reward"] is not None

    status = client.status("es-stragglers")
    assert status["cancelled"] is False and status["early_stopped"] == 2
    assert status["request"]["early_stop_min_usable_sessions"] == 2
    client.ack_group("es-stragglers")


def test_without_early_stop_a_cancel_is_not_labelled(client, pipeline):
    """DELETE stays a user's cancel: no early_stopped label, `cancelled` true."""
    sub = client.submit(straggler_task("es-user-cancel"))
    deadline = time.time() + 60
    while time.time() < deadline:
        states = [s["state"] for s in client.status("es-user-cancel")["sessions"]]
        if states.count("COMPLETED") >= 2 and states.count("RUNNING") == 2:
            break
        time.sleep(0.3)
    client.cancel("es-user-cancel")
    recs = pipeline.wait(sub["session_ids"], timeout=60)
    assert sorted(r.state for r in recs) == ["COMPLETED", "COMPLETED", "ERROR", "ERROR"]
    status = client.status("es-user-cancel")
    assert status["cancelled"] is True and status["early_stopped"] == 0
    for sid in sub["session_ids"]:
        assert "early_stopped" not in pipeline.store.get_trajectory(sid).metadata


@pytest.mark.parametrize("value,field", [(5, "early_stop_min_usable_sessions"), (0, "early_stop_min_usable_sessions"),
                                         ("2", "early_stop_min_usable_sessions")])
def test_bad_early_stop_is_a_400_naming_the_field(client, value, field):
    with pytest.raises(ApiError) as err:
        client.submit(straggler_task("es-bad", early_stop_min_usable_sessions=value))
    assert err.value.status == 400 and field in str(err.value)
