"""A session that gives up says why: the last attempt's cause is in its `error` (and so in the
API's session status), not only in the worker's log. Real pipeline (Redis, Celery init and
postrun pools) whose gateway URL points at a closed port."""

from __future__ import annotations

import socket
from types import SimpleNamespace

import pytest
import requests

from tests.support.pipeline import agent_task, make_pipeline
from polar_mq import states
from polar_mq.tasks.app import causes


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens once the socket is closed


@pytest.mark.timeout(180)
def test_unreachable_gateway_is_the_sessions_error(tmp_path):
    url = f"http://127.0.0.1:{closed_port()}"
    p = make_pipeline(SimpleNamespace(url=url), tmp_path, POLAR_MAX_ATTEMPTS="2")
    try:
        p.start_worker("init", 1)
        p.start_worker("run", 1)  # init prepares only on a node that can run what it prepares
        p.start_worker("postrun", 1)
        _, [sid] = p.submit(agent_task(num_samples=1))
        [rec] = p.wait([sid], timeout=120)
    finally:
        p.stop()
    assert rec.state == states.ERROR, (rec.state, rec.error)
    assert rec.error.startswith(f"gateway unreachable at {url}: connection refused; gave up after 2 attempts"), rec.error


def test_gateway_failure_wording():
    try:
        requests.get(f"http://127.0.0.1:{closed_port()}/sessions", timeout=5)
    except requests.RequestException as exc:
        assert str(causes.gateway_failure("http://gw", exc)) == "gateway unreachable at http://gw: connection refused"
    resp = requests.Response()
    resp.status_code, resp._content = 401, b'{"title": "Unauthorized"}'
    err = causes.gateway_failure("http://gw", requests.HTTPError(response=resp))
    assert str(err) == 'gateway at http://gw answered 401: {"title": "Unauthorized"}'
    assert causes.describe(ValueError("bad")) == "ValueError: bad"


def test_only_the_last_attempts_cause_is_reported(redis_url):
    from polar_mq.store.core import connect
    from polar_mq.store.pipeline import PipelineStore

    store = PipelineStore(connect(redis_url))
    causes.remember(store, "s-cause", 0, causes.GatewayUnreachable("gateway unreachable at http://gw: timed out"))
    assert causes.last(store, "s-cause", 0) == "gateway unreachable at http://gw: timed out"
    assert causes.last(store, "s-cause", 1) is None  # attempt 1 left no cause (its worker died)
    assert causes.last(store, "no-such-session", 0) is None
