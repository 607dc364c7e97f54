"""Schemathesis against the rollout API's own /openapi.json (a real `polar-mq api` process).

The document must validate against the OpenAPI 3.1 meta-schema; then every operation is fuzzed
with schema-valid and schema-violating cases (bounded for CI: FUZZ_EXAMPLES per operation). No
answer may be a 5xx, every error must be problem details, answers must conform to the document,
and the API must keep answering a normal submit afterwards.
"""

from __future__ import annotations

import json
import os
import socket

import pytest
import requests

schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, settings  # noqa: E402
from schemathesis.specs.openapi.checks import negative_data_rejection, positive_data_acceptance  # noqa: E402

from tests.support.servers import AUTH, stop  # noqa: E402
from polar_mq.api.openapi import document  # noqa: E402
from tests.support.fuzz import FUZZ_EXAMPLES, count_case  # noqa: E402

TASK = {"instruction": "say hi", "agent": {"harness": "shell", "options": {"command": "echo hi"}}}


@pytest.fixture(scope="module")
def fuzz_api(log_dir, redis_url):
    from tests.api.test_api import start_api

    server = start_api(log_dir, redis_url.rsplit("/", 1)[0] + "/14", name="api-fuzz")
    yield server
    stop(server.proc)


# The document is built by a pure function, so the schema is loaded at collection time; the
# first test checks that the live /openapi.json is this same document.
schema = schemathesis.openapi.from_dict(document())


def test_openapi_document_validates_and_is_served(fuzz_api):
    schema.validate()  # the OpenAPI 3.1 meta-schema (raises on any violation)
    served = requests.get(f"{fuzz_api.url}/openapi.json", timeout=10)
    assert served.status_code == 200 and served.json() == document()


@schema.parametrize()
@settings(max_examples=FUZZ_EXAMPLES, deadline=None, derandomize=bool(os.environ.get("CI")),
          suppress_health_check=list(HealthCheck))
def test_api_answers_every_case_without_5xx(case, fuzz_api):
    # Schema-valid and schema-violating cases both run, under every check but two: no 5xx;
    # status codes, content types, headers and bodies as documented. Not "schema-valid data
    # accepted": the API has rules across fields that the document cannot state (shell needs
    # options.command, docker an image, a builder is a built-in or module:Class). Not
    # "schema-violating data refused": it counts an ignored unknown query parameter, and a case
    # whose Authorization header was dropped (we always send the token), as failures.
    # Long polls (groups/next, admin pause) may legitimately wait up to their documented maximum:
    # bound the wait so the suite stays within CI time (other values are kept, invalid ones too).
    if isinstance(case.query, dict) and "wait" in case.query:
        try:
            case.query["wait"] = min(float(case.query["wait"]), 1.0)
        except (TypeError, ValueError):
            pass
    resp = case.call_and_validate(base_url=fuzz_api.url, headers=AUTH, timeout=30,
                                  excluded_checks=[positive_data_acceptance, negative_data_rejection])
    count_case("api", resp.status_code)
    if resp.status_code >= 400:  # gunicorn's own answers included (serving.problem_error)
        assert resp.headers["content-type"][0].startswith("application/problem+json"), resp.text[:300]


@pytest.mark.parametrize("request_bytes,status", [
    (b"GET /v1/groups/stats HTTP/1.1\r\nHost: x\r\ncontent-length: dF42Xe0\r\n\r\n", 400),  # found by the fuzz
    (b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", 414),
    (b"GET / HTTP/1.1\r\n" + b"".join(b"X-H%d: v\r\n" % i for i in range(200)) + b"\r\n", 431),
])
def test_requests_gunicorn_refuses_get_problem_json_too(request_bytes, status, fuzz_api):
    """Requests the HTTP server refuses before the app sees them are answered in the API's error
    format as well, not gunicorn's HTML page."""
    host, port = fuzz_api.url.rsplit("/", 1)[-1].split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(request_bytes)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.split(b" ")[1] == str(status).encode(), head
    assert b"content-type: application/problem+json" in head.lower(), head
    problem = json.loads(body)
    assert problem["status"] == status and problem["title"] and problem["detail"], problem


def test_api_still_serves_after_fuzzing(fuzz_api):
    ok = requests.post(f"{fuzz_api.url}/v1/tasks", json=TASK, headers=AUTH, timeout=30)
    assert ok.status_code == 202, ok.text
    assert requests.get(f"{fuzz_api.url}/health", timeout=10).json()["status"] == "ok"
    requests.post(f"{fuzz_api.url}/v1/admin/resume", headers=AUTH, timeout=10)
    assert fuzz_api.proc.poll() is None
    assert "Traceback" not in fuzz_api.output(), fuzz_api.output()[-3000:]
