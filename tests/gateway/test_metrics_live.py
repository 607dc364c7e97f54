"""Live gateway metrics (/metrics, read with prometheus_client's own parser) and the gateway's
token-text endpoint, against real gateway processes and the stand-in model server."""

from __future__ import annotations

import threading
import time

import openai
import pytest
import redis
import requests
from prometheus_client.parser import text_string_to_metric_families

from tests.support.servers import AUTH, start_gateway, stop
from polar_mq.model import CaptureRecord
from polar_mq.proxy_app.web.metrics import FLUSH_INTERVAL, Batched, GatewayMetrics


def _admin(gateway) -> dict[str, str]:
    return dict(getattr(gateway, "admin_headers", None) or AUTH)


def scrape(url: str, headers: dict[str, str] | None = None) -> dict[tuple[str, tuple], float]:
    """Every sample of /metrics as {(name, sorted labels): value}, via the official parser."""
    resp = requests.get(f"{url}/metrics", headers=AUTH if headers is None else headers, timeout=10)
    assert resp.status_code == 200, resp.text
    assert resp.headers["Content-Type"].startswith("text/plain")
    out = {}
    for family in text_string_to_metric_families(resp.text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def chat(session: dict, text: str, stream: bool = False):
    client = openai.OpenAI(base_url=session["base_urls"]["openai"], api_key=session["key"], max_retries=0)
    if stream:
        return list(client.chat.completions.create(model="m", stream=True,
                                                   messages=[{"role": "user", "content": text}]))
    return client.chat.completions.create(model="m", messages=[{"role": "user", "content": text}])


def test_gateway_metrics_count_every_recorded_call(gateway):
    before = scrape(gateway.url, _admin(gateway))
    session = gateway.new_session()
    chat(session, "hello polar:notool")
    chat(session, "hello again polar:notool", stream=True)
    after = scrape(gateway.url, _admin(gateway))
    calls = gateway.calls(session["session_id"])
    assert len(calls) == 2

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    p = {"provider": "openai_chat"}
    assert delta("polar_mq_gateway_generations_total", status="ok", **p) == 2
    assert delta("polar_mq_gateway_completion_tokens_total", **p) == sum(len(c["completion_token_ids"]) for c in calls)
    assert delta("polar_mq_gateway_prompt_tokens_total", **p) == sum(len(c["prompt_token_ids"]) for c in calls)
    for stream in ("false", "true"):
        labels = {**p, "stream": stream, "status": "ok"}
        assert delta("polar_mq_gateway_call_seconds_count", **labels) == 1
        assert delta("polar_mq_gateway_call_seconds_bucket", le="+Inf", **labels) == 1
        buckets = sorted((float(dict(k[1])["le"]), v) for k, v in after.items()
                         if k[0] == "polar_mq_gateway_call_seconds_bucket"
                         and {n: x for n, x in k[1] if n != "le"} == labels)
        assert [v for _, v in buckets] == sorted(v for _, v in buckets)  # cumulative
    assert delta("polar_mq_gateway_decode_tokens_per_second_count", **p) == 2
    assert value(after, "polar_mq_gateway_inflight_generations") == 0


def test_inflight_gauge_sees_a_running_generation(gateway):
    session = gateway.new_session()
    worker = threading.Thread(target=chat, args=(session, "slow polar:sleep=1.5 polar:notool"))
    worker.start()
    try:
        deadline = time.time() + 1.2
        seen = 0.0
        while time.time() < deadline and not seen:
            seen = value(scrape(gateway.url, _admin(gateway)), "polar_mq_gateway_inflight_generations")
            time.sleep(0.1)
        assert seen == 1
    finally:
        worker.join()
    assert value(scrape(gateway.url, _admin(gateway)), "polar_mq_gateway_inflight_generations") == 0


@pytest.fixture(scope="module")
def two_worker_gateway(log_dir, redis_url, model_server):
    # The last --workers wins: two gunicorn worker processes behind one port.
    server = start_gateway(log_dir, redis_url, [model_server], "--workers", "2", name="gateway-2w")
    yield server.url
    stop(server.proc)


def test_metrics_sum_over_gunicorn_workers_and_count_retries_and_errors(two_worker_gateway):
    url = two_worker_gateway
    base = requests.post(f"{url}/sessions", json={}, headers=AUTH, timeout=10).json()
    for i in range(6):  # spread over both worker processes
        chat(base, f"call {i} polar:notool")
    failing = requests.post(f"{url}/sessions", json={}, headers=AUTH, timeout=10).json()
    with pytest.raises(openai.APIStatusError):
        chat(failing, "break polar:fail=500")
    # Each worker writes its sums every FLUSH_INTERVAL s (metrics.Batched): the other worker's
    # calls show within that, and from then on whichever worker answers, the totals are the same.
    deadline = time.monotonic() + 10 * FLUSH_INTERVAL
    while True:
        first = scrape(url)
        if (value(first, "polar_mq_gateway_generations_total", provider="openai_chat", status="ok") == 6
                and value(first, "polar_mq_gateway_generations_total", provider="openai_chat", status="error") == 1):
            break
        assert time.monotonic() < deadline, "a worker's calls did not reach the scrape"
        time.sleep(FLUSH_INTERVAL / 5)
    scrapes = [scrape(url) for _ in range(6)]
    assert len({value(s, "polar_mq_gateway_generations_total", provider="openai_chat", status="ok") for s in scrapes}) == 1
    s = scrapes[0]
    assert value(s, "polar_mq_gateway_generations_total", provider="openai_chat", status="ok") == 6
    assert value(s, "polar_mq_gateway_generations_total", provider="openai_chat", status="error") == 1
    errors = {dict(k[1])["kind"]: v for k, v in s.items() if k[0] == "polar_mq_gateway_upstream_errors_total"}
    assert sum(errors.values()) == 1, errors
    retries = sum(v for k, v in s.items() if k[0] == "polar_mq_gateway_upstream_retries_total")
    assert retries == 3  # GatewaySettings.retries: three more attempts before the error


def test_tito_fields_are_read_when_present_and_ignored_when_absent():
    m = GatewayMetrics()
    plain = CaptureRecord(session_id="s", provider="anthropic", latency_ms=100, completion_token_ids=[1, 2])
    m.observe(plain)
    continued = CaptureRecord(session_id="s", provider="anthropic", latency_ms=100)
    setattr(continued, "tito", True)
    setattr(continued, "parent_call_id", "call_1")
    m.observe(continued)
    rerendered = CaptureRecord(session_id="s", provider="anthropic", latency_ms=100)
    setattr(rerendered, "tito", False)
    setattr(rerendered, "parent_call_id", "call_2")
    m.observe(rerendered)
    first = CaptureRecord(session_id="s", provider="anthropic", latency_ms=100)
    setattr(first, "tito", False)
    setattr(first, "parent_call_id", None)
    m.observe(first)
    samples = {}
    for family in text_string_to_metric_families(m.exposition()[0].decode()):  # a scrape writes the sums
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    assert value(samples, "polar_mq_gateway_tito_continuations_total", provider="anthropic") == 1
    assert value(samples, "polar_mq_gateway_tito_breaks_total", provider="anthropic") == 1
    assert value(samples, "polar_mq_gateway_generations_total", provider="anthropic", status="ok") == 4
    assert value(samples, "polar_mq_gateway_decode_tokens_per_second_sum", provider="anthropic") == 20.0


def _samples(registry) -> dict:
    from prometheus_client import generate_latest

    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(generate_latest(registry).decode())
            for s in family.samples if not s.name.endswith("_created")}


@pytest.mark.parametrize("internals", [True, False])
def test_batched_updates_write_what_direct_updates_write(internals):
    """The sums Batched writes equal the same updates made one by one: counters, a gauge going
    up and down, histogram observations on, between and beyond the bucket bounds (with and
    without prometheus_client's histogram internals); nothing shows before a flush."""
    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

    def metrics(registry):
        return (Counter("c", "c", ["k"], registry=registry), Gauge("g", "g", registry=registry),
                Histogram("h", "h", ["k"], buckets=(0.1, 1, 5), registry=registry))

    direct, batched_reg = CollectorRegistry(), CollectorRegistry()
    (dc, dg, dh), (bc, bg, bh) = metrics(direct), metrics(batched_reg)
    batched = Batched(interval=3600)
    values = [0.0, 0.1, 0.05, 1, 1.0000001, 5, 7.5, 0.1, 1e9]
    for i, v in enumerate(values):
        key = "a" if i % 2 else "b"
        dh.labels(key).observe(v)
        child = bh.labels(key)
        if not internals:
            child = type("Bare", (), {"observe": child.observe})()
        batched.observe(child, v)
        dc.labels(key).inc(v)
        batched.inc(bc.labels(key), v)
    for delta in (1, 1, -1, 1, -1):
        dg.inc(delta)
        batched.inc(bg, delta)
    assert set(_samples(batched_reg).values()) == {0.0}
    batched.flush()
    assert _samples(batched_reg) == _samples(direct)
    batched.flush()  # nothing pending: nothing written twice
    assert _samples(batched_reg) == _samples(direct)


# --- token text -----------------------------------------------------------------------------------
def test_token_text_is_the_upstream_decoding_of_each_id_and_is_cached(gateway):
    ids = [1, 2, 207, 272, 304]
    resp = requests.post(f"{gateway.url}/tokens/text", json={"ids": ids + [272]}, headers=_admin(gateway), timeout=30)
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["model"] and sorted(body["texts"]) == sorted(str(i) for i in ids)
    for i in ids:
        single = requests.post(f"{gateway.upstream_url}/detokenize", json={"model": body["model"], "tokens": [i]},
                               timeout=10).json()["prompt"]
        assert body["texts"][str(i)] == single
    cache = redis.Redis.from_url(gateway.redis_url).hgetall(f"pmq:gw:toktext:{body['model']}")
    assert {int(k): v.decode() for k, v in cache.items() if int(k) in ids} == {i: body["texts"][str(i)] for i in ids}


def test_token_text_rejects_bad_input_with_a_problem(gateway):
    h = _admin(gateway)
    for bad in ({}, {"ids": "1,2"}, {"ids": [1, "x"]}, {"ids": [-1]}, {"ids": [True]}, [1, 2]):
        resp = requests.post(f"{gateway.url}/tokens/text", json=bad, headers=h, timeout=10)
        assert resp.status_code == 400, (bad, resp.text)
        assert resp.headers["Content-Type"] == "application/problem+json" and resp.json()["detail"]
    out_of_vocab = requests.post(f"{gateway.url}/tokens/text", json={"ids": [10**9]}, headers=h, timeout=10)
    assert out_of_vocab.status_code == 200 and out_of_vocab.json()["texts"] == {str(10**9): None}
