"""Sampling the trainer can trust, and no upstream work nobody wants.

Real gateway process, real redis-server, the stand-in model server (which reports, as vLLM
would see them, the sampling parameters it received and the generations that were aborted),
official SDKs and plain HTTP as clients.
"""

from __future__ import annotations

import threading
import time

import anthropic
import openai
import pytest
import requests

from tests.support.servers import AUTH, GatewayHandle, start_gateway, start_model_server, stop

TOKEN_MS = 25
LONG = "polar:long tell me a long story"


@pytest.fixture(scope="module")
def slow_upstream(log_dir) -> str:
    server = start_model_server(log_dir, "--max-model-len", "65536", "--token-latency-ms", str(TOKEN_MS),
                                name="ms-cancel")
    yield server.url
    stop(server.proc)


@pytest.fixture(scope="module")
def gw(log_dir, redis_url, slow_upstream) -> GatewayHandle:
    server = start_gateway(log_dir, redis_url, [slow_upstream], name="gw-cancel")
    yield GatewayHandle(url=server.url, upstream_url=slow_upstream, redis_url=redis_url, server=server)
    stop(server.proc)


def generations(gw: GatewayHandle) -> dict:
    return requests.get(f"{gw.upstream_url}/polar/generations", timeout=10).json()


def wait_record(gw: GatewayHandle, sid: str, n: int = 1, timeout: float = 20.0) -> list[dict]:
    deadline = time.time() + timeout
    while True:
        calls = gw.calls(sid)
        if len(calls) >= n or time.time() > deadline:
            assert len(calls) == n, calls
            return calls
        time.sleep(0.05)


def long_plain_call(s: dict) -> tuple[threading.Thread, dict]:
    """A plain call that generates for seconds, on a thread; `out["resp"]` once it answered."""
    out: dict = {}
    t = threading.Thread(target=lambda: out.setdefault("resp", requests.post(
        f"{s['base_urls']['openai']}/chat/completions", timeout=60,
        json={"model": "m", "messages": [{"role": "user", "content": LONG}]})))
    t.start()
    return t, out


def cancel(g: GatewayHandle, s: dict) -> None:
    requests.post(f"{g.url}/sessions/{s['session_id']}/cancel", headers=AUTH, timeout=10).raise_for_status()


def wait_aborted(gw: GatewayHandle, before: int, timeout: float = 10.0) -> dict:
    deadline = time.time() + timeout
    while True:
        snap = generations(gw)
        if len(snap["aborted"]) > before or time.time() > deadline:
            assert len(snap["aborted"]) > before, snap
            return snap["aborted"][-1]
        time.sleep(0.05)


# --- sampling policy ---------------------------------------------------------------------------
def test_session_policy_overrides_what_the_harness_asks_and_both_are_recorded(gw):
    policy = {"temperature": 0.7, "top_p": 0.95, "top_k": 40, "max_tokens": 5, "seed": 11, "stop": ["\n\n"]}
    s = gw.new_session(sampling=policy)
    assert s["sampling"] == policy
    client = anthropic.Anthropic(base_url=s["base_urls"]["anthropic"], api_key=s["key"])
    msg = client.messages.create(model="m", max_tokens=300, extra_body={"temperature": 0.0, "top_p": 0.5},
                                 messages=[{"role": "user", "content": LONG}])
    assert msg.stop_reason == "max_tokens"  # the cap (5), not the harness's 300
    (rec,) = wait_record(gw, s["session_id"])
    sent = generations(gw)["recent"][-1]["params"]
    assert sent == {k: policy[k] for k in policy}  # what reached the upstream
    assert {k: rec["params"][k] for k in policy} == policy
    assert rec["requested_params"]["temperature"] == 0.0 and rec["requested_params"]["max_tokens"] == 300
    assert rec["requested_params"]["top_p"] == 0.5 and len(rec["completion_token_ids"]) == 5


def test_max_tokens_is_a_cap_a_smaller_request_keeps_its_limit(gw):
    s = gw.new_session(sampling={"max_tokens": 50})
    client = openai.OpenAI(base_url=s["base_urls"]["openai"], api_key=s["key"])
    client.chat.completions.create(model="m", max_tokens=3, messages=[{"role": "user", "content": LONG}])
    (rec,) = wait_record(gw, s["session_id"])
    assert rec["params"]["max_tokens"] == 3 and rec["requested_params"]["max_tokens"] == 3


def test_bad_policy_is_a_400_naming_the_field(gw):
    resp = requests.post(f"{gw.url}/sessions", headers=AUTH, json={"sampling": {"top_p": 2}}, timeout=10)
    assert resp.status_code == 400 and "sampling.top_p" in resp.json()["detail"]


# --- aborting upstream work --------------------------------------------------------------------
def test_client_gone_mid_stream_aborts_the_upstream_generation(gw):
    s = gw.new_session()
    before = len(generations(gw)["aborted"])
    resp = requests.post(f"{s['base_urls']['openai']}/chat/completions", stream=True, timeout=30,
                         json={"model": "m", "stream": True, "messages": [{"role": "user", "content": LONG}]})
    pieces = 0
    for line in resp.iter_lines():
        if b'"content":"' in line and b'"content":""' not in line:
            pieces += 1
            if pieces == 3:
                break
    resp.close()  # the harness was killed
    aborted = wait_aborted(gw, before)
    assert 3 <= aborted["sent_tokens"] < aborted["planned_tokens"] / 2
    (rec,) = wait_record(gw, s["session_id"])
    assert rec["status"] == "error" and rec["error"].startswith("permission: cancelled: the client closed")
    # What was sampled before the abort is kept, ids and logprobs aligned.
    assert 3 <= len(rec["completion_token_ids"]) == len(rec["completion_logprobs"]) <= aborted["sent_tokens"]


def test_session_cancel_aborts_a_plain_call_and_refuses_new_ones(gw):
    s = gw.new_session()
    before = len(generations(gw)["aborted"])
    out: dict = {}

    def call() -> None:
        t0 = time.monotonic()
        out["resp"] = requests.post(f"{s['base_urls']['openai']}/chat/completions", timeout=60,
                                    json={"model": "m", "messages": [{"role": "user", "content": LONG}]})
        out["s"] = time.monotonic() - t0

    t = threading.Thread(target=call)
    t.start()
    time.sleep(0.6)
    r = requests.post(f"{gw.url}/sessions/{s['session_id']}/cancel", headers=AUTH, timeout=10)
    assert r.status_code == 200 and r.json()["cancelled"] is True
    t.join(30)
    aborted = wait_aborted(gw, before)
    assert aborted["sent_tokens"] < aborted["planned_tokens"]
    resp = out["resp"]
    assert resp.status_code == 403 and "cancelled" in resp.json()["error"]["message"]
    (rec,) = wait_record(gw, s["session_id"])
    assert rec["status"] == "error" and rec["completion_token_ids"]  # the sampled prefix is kept
    # The call went upstream plain, named by its call id, and was stopped by that id
    # (/abort_requests): the upstream's own answer carried the prefix, ids and logprobs aligned.
    assert aborted["id"] == f"chatcmpl-polar-{rec['call_id']}"
    assert len(rec["completion_token_ids"]) == len(rec["completion_logprobs"]) == aborted["sent_tokens"]
    assert rec["finish_reason"] == "abort"
    # New calls of a cancelled session are refused in the provider's shape and never go upstream.
    n = len(generations(gw)["recent"])
    client = anthropic.Anthropic(base_url=s["base_urls"]["anthropic"], api_key=s["key"], max_retries=0)
    with pytest.raises(anthropic.APIStatusError) as err:
        client.messages.create(model="m", max_tokens=10, messages=[{"role": "user", "content": "hi"}])
    assert err.value.status_code == 403 and "no new generations" in err.value.message
    assert len(generations(gw)["recent"]) == n
    assert requests.get(f"{gw.url}/sessions/{s['session_id']}", headers=AUTH, timeout=10).json()["inflight_calls"] == 0


def test_client_gone_during_a_plain_call_aborts_it(gw):
    s = gw.new_session()
    before = len(generations(gw)["aborted"])
    with pytest.raises(requests.exceptions.ReadTimeout):
        requests.post(f"{s['base_urls']['openai']}/chat/completions", timeout=(5, 0.8),
                      json={"model": "m", "messages": [{"role": "user", "content": LONG}]})
    aborted = wait_aborted(gw, before)
    assert aborted["sent_tokens"] < aborted["planned_tokens"]
    (rec,) = wait_record(gw, s["session_id"])
    assert rec["status"] == "error" and "client closed" in rec["error"]
    assert aborted["id"] == f"chatcmpl-polar-{rec['call_id']}"


@pytest.fixture(scope="module")
def gw_no_abort(log_dir, redis_url) -> GatewayHandle:
    """An upstream served without vLLM's dev-mode routes: no /abort_requests."""
    up = start_model_server(log_dir, "--max-model-len", "65536", "--token-latency-ms", str(TOKEN_MS),
                            "--no-dev-mode", name="ms-cancel-nodev")
    server = start_gateway(log_dir, redis_url, [up.url], name="gw-cancel-nodev")
    yield GatewayHandle(url=server.url, upstream_url=up.url, redis_url=redis_url, server=server)
    stop(server.proc)
    stop(up.proc)


def upstreams(gw: GatewayHandle) -> list[dict]:
    return requests.get(f"{gw.url}/health", timeout=10).json()["upstreams"]


def test_plain_calls_go_upstream_plain_where_the_upstream_aborts_by_id(gw, gw_no_abort):
    """A plain call is sent plain (one body back instead of a chunk per token) where the upstream
    stops requests by id, and named by its call id; elsewhere it is streamed from the upstream,
    so that closing the connection can still abort it (vLLM runs a plain request to its end)."""
    assert [u["abort_by_id"] for u in upstreams(gw)] == [True]
    assert [u["abort_by_id"] for u in upstreams(gw_no_abort)] == [False]
    for g, named in ((gw, True), (gw_no_abort, False)):
        s = g.new_session()
        client = openai.OpenAI(base_url=s["base_urls"]["openai"], api_key=s["key"], max_retries=0)
        r = client.chat.completions.create(model="m", max_tokens=4, messages=[{"role": "user", "content": "hi"}])
        assert r.choices[0].finish_reason == "length"
        (rec,) = wait_record(g, s["session_id"])
        assert len(rec["completion_token_ids"]) == len(rec["completion_logprobs"]) == 4
        last = generations(g)["recent"][-1]
        assert (last["id"] == f"chatcmpl-polar-{rec['call_id']}") is named, last


def test_without_abort_by_id_a_cancelled_plain_call_is_still_aborted(gw_no_abort):
    s = gw_no_abort.new_session()
    before = len(generations(gw_no_abort)["aborted"])
    t, out = long_plain_call(s)
    time.sleep(0.6)
    cancel(gw_no_abort, s)
    t.join(30)
    aborted = wait_aborted(gw_no_abort, before)
    assert aborted["sent_tokens"] < aborted["planned_tokens"]
    assert out["resp"].status_code == 403
    (rec,) = wait_record(gw_no_abort, s["session_id"])
    assert rec["status"] == "error" and rec["completion_token_ids"]
    assert not aborted["id"].startswith("chatcmpl-polar-")  # streamed, closed: not aborted by id


def test_inflight_calls_are_visible_until_recorded(gw):
    s = gw.new_session()
    t = threading.Thread(target=lambda: requests.post(
        f"{s['base_urls']['openai']}/chat/completions", timeout=60,
        json={"model": "m", "max_tokens": 40, "messages": [{"role": "user", "content": LONG}]}))
    t.start()
    time.sleep(0.4)
    assert requests.get(f"{gw.url}/sessions/{s['session_id']}", headers=AUTH, timeout=10).json()["inflight_calls"] == 1
    t.join(30)
    assert requests.get(f"{gw.url}/sessions/{s['session_id']}", headers=AUTH, timeout=10).json()["inflight_calls"] == 0
    assert wait_record(gw, s["session_id"])[0]["status"] == "ok"


def test_an_abort_sent_before_the_upstream_admits_the_call_is_sent_again(gw):
    """vLLM ignores an abort for an id it has not admitted yet (a request still being rendered,
    or held by a paused scheduler): the gateway sends the abort again every ABORT_RESEND s until
    the answer is in. Here the upstream holds the call (its /pause) while the session is
    cancelled, then admits it: the resent abort stops it after a token or two, not after all."""
    s = gw.new_session()
    before = len(generations(gw)["aborted"])
    requests.post(f"{gw.upstream_url}/pause", params={"mode": "keep"}, timeout=10).raise_for_status()
    try:
        t, out = long_plain_call(s)
        time.sleep(0.5)
        cancel(gw, s)
        time.sleep(0.7)  # the first abort has gone out and found nothing running
        assert len(generations(gw)["aborted"]) == before and t.is_alive()
    finally:
        requests.post(f"{gw.upstream_url}/resume", timeout=10).raise_for_status()
    t.join(30)
    aborted = wait_aborted(gw, before)
    assert aborted["sent_tokens"] < aborted["planned_tokens"] / 2, aborted
    assert out["resp"].status_code == 403
    (rec,) = wait_record(gw, s["session_id"])
    assert rec["status"] == "error" and aborted["id"] == f"chatcmpl-polar-{rec['call_id']}"


def test_an_upstream_that_stops_serving_abort_by_id_gets_streamed_plain_calls_again(log_dir):
    """An upstream restarted without dev mode answers the abort 404: the pool marks it, and the
    next plain calls are streamed from it again (closing the connection still aborts them)."""
    from polar_mq.proxy_app.upstream.pool import UpstreamPool

    up = start_model_server(log_dir, "--no-dev-mode", name="ms-nodev-restart")
    pool = UpstreamPool([up.url])
    try:
        (u,) = pool.check_all()
        assert u.abort_by_id is False
        u.abort_by_id = True  # as probed before the restart
        assert pool.can_abort("s")
        assert pool.abort(up.url, ["chatcmpl-polar-x"]) is False
        assert u.abort_by_id is False and not pool.can_abort("s") and pool.can_stream("s")
    finally:
        pool.close()
        stop(up.proc)
