"""vLLM 0.32's RL API for real (served with VLLM_SERVER_DEV_MODE=1, see scripts/vllm_cpu.py):
the stand-in answers its endpoints in the same shapes, and `polar-mq`'s admin pause / resume
drive it through the gateway's registration: vLLM is paused, its weight version set and
reported, and the session's calls carry the policy version across the sync."""

from __future__ import annotations

import sys
import threading
import time

import requests

from tests.vllm.conftest import SERVED, free_port, spawn, start_model_server, stop
from tests.vllm.shapes import diff


def rl_exchange(url: str) -> list:
    """The same RL calls against one server; returns (status, body) per call."""
    out = []
    for method, path, kwargs in [
        ("GET", "/is_paused", {}),
        ("POST", "/update_weight_version", {"json": {"new_version": "contract-1"}}),
        ("GET", "/weight_info", {}),
        ("POST", "/pause", {"params": {"mode": "keep"}}),
        ("GET", "/is_paused", {}),
        ("POST", "/resume", {}),
        ("GET", "/is_paused", {}),
    ]:
        r = requests.request(method, url + path, timeout=60, **kwargs)
        out.append((r.status_code, r.json()))
    for path, kwargs in [("/pause", {"params": {"mode": "later"}}),
                         ("/update_weight_version", {"json": {}}),
                         ("/update_weight_version", {"json": {"new_version": 5}})]:
        bad = requests.post(url + path, timeout=30, **kwargs)
        err = bad.json()["error"]
        out.append((bad.status_code, err["type"], err["param"], err["code"], err["message"]))
    return out


def test_standin_rl_api_matches_real_vllm(vllm_url, standin_url):
    real, ours = rl_exchange(vllm_url), rl_exchange(standin_url)
    assert real[0] == (200, {"is_paused": False})
    assert real[1] == (200, {"success": True, "new_version": "contract-1"})
    assert real[2] == (200, {"weight_version": "contract-1"})
    assert real[3] == (200, {"status": "paused"}) and real[4] == (200, {"is_paused": True})
    assert real[5] == (200, {"status": "resumed"}) and real[6] == (200, {"is_paused": False})
    assert ours == real


def test_admin_pause_and_resume_drive_real_vllm(vllm_gateway, vllm_url, redis_url, log_dir):
    port = free_port()
    api = spawn([sys.executable, "-m", "polar_mq.cli", "api", "--host", "127.0.0.1", "--port", str(port),
                 "--redis", redis_url, "--workers", "1"], f"http://127.0.0.1:{port}/health", log_dir,
                f"api-vllm-rl-{port}", env={"POLAR_API_TOKEN": ""})
    base = f"http://127.0.0.1:{port}"
    s = vllm_gateway.new_session()

    def chat(text: str) -> requests.Response:
        return requests.post(f"{s['base_urls']['openai']}/chat/completions", timeout=120,
                             json={"model": SERVED, "messages": [{"role": "user", "content": text}],
                                   "max_tokens": 8, "temperature": 0})

    try:
        requests.post(f"{base}/v1/admin/resume", headers=vllm_gateway.admin_headers, json={"policy_version": 40}, timeout=60).raise_for_status()
        chat("hello").raise_for_status()
        paused = requests.post(f"{base}/v1/admin/pause", headers=vllm_gateway.admin_headers, params={"wait": 30, "mode": "wait"}, timeout=120).json()
        assert paused["drained"] is True
        assert paused["upstreams"][vllm_url]["rl_api"] is True and paused["upstreams"][vllm_url]["is_paused"] is True
        assert requests.get(f"{vllm_url}/is_paused", timeout=10).json() == {"is_paused": True}
        results: dict[str, float] = {}
        held = threading.Thread(target=lambda: results.setdefault("status", chat("again").status_code))
        held.start()  # held at the gateway until resume (vLLM itself is paused too)
        time.sleep(1.0)
        assert "status" not in results
        resumed = requests.post(f"{base}/v1/admin/resume", headers=vllm_gateway.admin_headers, json={"policy_version": 41}, timeout=60).json()
        assert resumed["upstreams"][vllm_url] == {"rl_api": True, "weight_version": "41", "is_paused": False}
        assert requests.get(f"{vllm_url}/weight_info", timeout=10).json() == {"weight_version": "41"}
        held.join(120)
        assert results["status"] == 200
        calls = vllm_gateway.calls(s["session_id"])
        assert [c["policy_version"] for c in calls] == [40, 41]
        assert calls[1]["held_ms"] >= 900 and calls[1]["completion_token_ids"]
        status = requests.get(f"{base}/v1/admin/status", headers=vllm_gateway.admin_headers, timeout=10).json()
        assert status["upstreams"][vllm_url]["weight_version"] == "41" and status["policy_version"] == 41
    finally:
        requests.post(f"{base}/v1/admin/resume", headers=vllm_gateway.admin_headers, timeout=60)
        stop(api.proc)


def abort_errors(url: str) -> list:
    out = []
    for kwargs in [{"json": {"request_ids": ["chatcmpl-polar-none"]}},
                   {"data": b"{no", "headers": {"Content-Type": "application/json"}},
                   {"json": ["chatcmpl-polar-none"]}]:
        r = requests.post(url + "/abort_requests", timeout=30, **kwargs)
        out.append((r.status_code, r.json()))
    return out


def aborted_plain_answer(url: str, post, request_id: str, content: str) -> tuple[dict, dict]:
    """A plain generation stopped by id mid-way (resent every 0.3 s until it answers, as the
    gateway's UpstreamAborter does): the answer body, and when it came and which aborts were sent."""
    body = {"model": SERVED, "max_tokens": 6000, "ignore_eos": True, "logprobs": True,
            "return_token_ids": True, "messages": [{"role": "user", "content": content}]}
    out: dict = {}
    t0 = time.monotonic()
    t = threading.Thread(target=lambda: out.setdefault("r", post(body, request_id)))
    t.start()
    time.sleep(1.0)
    aborts = []  # (seconds after the request, status) of every abort sent, for the failure message
    while t.is_alive():
        r = requests.post(url + "/abort_requests", json={"request_ids": [f"chatcmpl-{request_id}"]}, timeout=30)
        aborts.append((round(time.monotonic() - t0, 2), r.status_code))
        t.join(0.3)
    return out["r"], {"url": url, "answered_after_s": round(time.monotonic() - t0, 2), "aborts": aborts}


def test_abort_by_id_on_the_stand_in_matches_real_vllm(vllm_url, vllm_lowered, standin_url, log_dir):
    """vLLM dev mode's /abort_requests, which the gateway stops plain calls with: the same
    answers on the stand-in, and a plain request so stopped answers 200 with what it sampled,
    ids and logprobs aligned, finish_reason "abort", named after its X-Request-Id. vLLM runs
    lowered (``vllm_lowered``): at its normal priority its CPU worker can starve every other
    process for the whole 6000-token generation, so no abort lands and the answer ends with
    finish_reason "length" (scripts/vllm_cpu.py ``lowered``)."""
    assert abort_errors(standin_url) == abort_errors(vllm_url)
    assert abort_errors(vllm_url)[0] == (200, {"status": "aborted", "aborted": 1})

    def via_http(url: str):
        return lambda body, rid: requests.post(url + "/v1/chat/completions", json=body, timeout=120,
                                               headers={"X-Request-Id": rid}).json()

    real, real_trace = aborted_plain_answer(vllm_url, via_http(vllm_url), "polar-contract-abort", "Tell a very long story.")
    slow = start_model_server(log_dir, "--served-model-name", SERVED, "--token-latency-ms", "5",
                              name="standin-abort-contract")
    try:
        ours, ours_trace = aborted_plain_answer(slow.url, via_http(slow.url), "polar-contract-abort",
                                    "polar:long Tell a very long story.")
    finally:
        stop(slow.proc)
    trace = {"real": real_trace, "ours": ours_trace}
    assert not diff(real, ours), diff(real, ours)
    for answer in (real, ours):
        choice = answer["choices"][0]
        assert answer["id"] == "chatcmpl-polar-contract-abort", trace
        # a "length" here is a generation no abort reached: the trace says which server, when
        assert choice["finish_reason"] == "abort", (choice["finish_reason"], answer["usage"], trace)
        n = len(choice["token_ids"])
        assert 1 <= n < 6000 and len(choice["logprobs"]["content"]) == n == answer["usage"]["completion_tokens"]


def test_a_keep_pause_splits_a_real_vllm_stream(vllm_gateway, vllm_url, redis_url, log_dir):
    """vLLM's pause mode keep freezes a generation in flight; after the resume it goes on with the
    new weights: its record carries two policy versions, split at the first token after the resume
    (CONTRACT "Agent lineage and versions per token"; proxy_app/versions.py)."""
    port = free_port()
    api = spawn([sys.executable, "-m", "polar_mq.cli", "api", "--host", "127.0.0.1", "--port", str(port),
                 "--redis", redis_url, "--workers", "1"], f"http://127.0.0.1:{port}/health", log_dir,
                f"api-vllm-keep-{port}", env={"POLAR_API_TOKEN": ""})
    base, headers = f"http://127.0.0.1:{port}", vllm_gateway.admin_headers
    try:
        requests.post(f"{base}/v1/admin/resume", headers=headers, json={"policy_version": 50},
                      timeout=60).raise_for_status()
        s = vllm_gateway.new_session()
        body = {"model": SERVED, "stream": True, "max_tokens": 6000, "ignore_eos": True, "temperature": 0,
                "messages": [{"role": "user", "content": "Tell a very long story."}]}
        seen: list[bytes] = []
        failed: list[str] = []

        def read() -> None:
            with requests.post(f"{s['base_urls']['openai']}/chat/completions", json=body, stream=True,
                               timeout=300) as resp:
                if not resp.ok:
                    failed.append(f"{resp.status_code} {resp.text[:500]}")
                    return
                for line in resp.iter_lines():
                    if line:
                        seen.append(line)

        reader = threading.Thread(target=read)
        reader.start()
        deadline = time.monotonic() + 60
        while not seen and time.monotonic() < deadline:  # the stream has begun (frames batch tokens)
            time.sleep(0.005)
        time.sleep(0.2)
        assert reader.is_alive(), (failed, [(c["finish_reason"], len(c["completion_token_ids"]))
                                            for c in vllm_gateway.calls(s["session_id"])])
        paused = requests.post(f"{base}/v1/admin/pause", headers=headers, params={"wait": 0.2, "mode": "keep"},
                               timeout=120).json()
        assert paused["drained"] is False and paused["upstreams"][vllm_url]["is_paused"] is True
        time.sleep(1.5)
        assert reader.is_alive()  # frozen by the engine, not finished
        requests.post(f"{base}/v1/admin/resume", headers=headers, json={"policy_version": 51},
                      timeout=60).raise_for_status()
        reader.join(300)
        [rec] = vllm_gateway.calls(s["session_id"])
        n = len(rec["completion_token_ids"])
        assert rec["policy_version"] == 50 and n == 6000
        pairs = rec["policy_versions"]
        assert len(pairs) == 2 and pairs[0] == [0, 50] and pairs[1][1] == 51, pairs
        assert 0 < pairs[1][0] < n, pairs
    finally:
        requests.post(f"{base}/v1/admin/resume", headers=vllm_gateway.admin_headers, timeout=60)
        stop(api.proc)
