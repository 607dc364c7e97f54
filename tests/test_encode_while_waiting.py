"""A call's record encodes its request side while the upstream generates (record_codec.Encoder
.prepare, proxy_app/while_waiting.py, core.Gateway.encode_while_waiting).

What must hold: a prepared encoder gives exactly the envelope, chunks and references an
unprepared one gives (and ignores its work when the record's request side was replaced); under
gevent the queued work runs when the caller blocks, and not after it was cancelled; without
gevent nothing is queued; and a gateway under gevent runs it during the upstream's wait, the
record stored as before (real Redis, the gateway in a gevent-patched subprocess, a MockPool
upstream that takes its time).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from polar_mq import record_codec
from polar_mq.model import CaptureRecord

TESTS = Path(__file__).parent
JSON = st.recursive(st.none() | st.booleans() | st.integers(-10, 10 ** 6) | st.text(max_size=80),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                    max_leaves=12)
MESSAGE = st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "tool"]), "content": JSON})


def _record(messages: list[Any], tools: list[Any], extra: Any) -> CaptureRecord:
    return CaptureRecord(session_id="s-prep", provider="anthropic", stream=False, model_requested="m",
                         request={"messages": messages, "system": [extra], "tools": tools, "max_tokens": 9},
                         messages=messages, tools=tools, prompt_token_ids=list(range(700)),
                         completion_token_ids=[5, 6], completion_logprobs=[-0.1, -0.2],
                         response_message={"role": "assistant", "content": "done " * 20})


@settings(max_examples=40, deadline=None)
@given(st.lists(MESSAGE, max_size=6), st.lists(JSON, max_size=3), JSON, st.integers(0, 3))
def test_a_prepared_encoder_gives_the_same_envelope(messages: list[Any], tools: list[Any], extra: Any,
                                                    known_from: int) -> None:
    rec = _record(messages, tools, extra)
    # Chunks already stored for the session: those of the first `known_from` messages.
    known = record_codec.Encoder()
    known.refs(messages[:known_from])
    plain = record_codec.encode(rec, record_codec.Encoder(set(known.used)))
    prepared = record_codec.Encoder(set(known.used))
    prepared.prepare(rec)
    assert record_codec.encode(rec, prepared) == plain
    stored = {**known.chunks, **plain[1]}  # what Redis holds for the session afterwards
    assert record_codec.decode(plain[0], stored).to_dict() == rec.to_dict()


def test_work_on_a_request_side_that_was_replaced_is_not_used() -> None:
    rec = _record([{"role": "user", "content": "first " * 30}], [], "sys")
    enc = record_codec.Encoder()
    enc.prepare(rec)
    rec.messages = [{"role": "user", "content": "second " * 30}]
    blob, chunks, _ = record_codec.encode(rec, enc)
    assert record_codec.decode(blob, chunks).messages == rec.messages


def _run(code: str, env: dict[str, str] | None = None) -> list[str]:
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                         timeout=120, cwd=TESTS.parent, env={**os.environ, "PYTHONPATH": f"{TESTS.parent}:{TESTS}",
                                                             **(env or {})})
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


def test_queued_work_runs_when_the_caller_blocks_under_gevent_only() -> None:
    probe = """
        import time
        from polar_mq.proxy_app import while_waiting
        done = []
        first = while_waiting.queue(lambda: done.append("first"))
        second = while_waiting.queue(lambda: done.append("second"))
        print(first.ran, second.ran, len(done))       # nothing runs before the caller waits
        second.cancel()
        time.sleep(0.01)                              # the caller waits (a greenlet switch under gevent)
        print(first.ran, second.ran, ",".join(done) or "-")
        print(first.cancel(), second.cancel())        # cancel after the fact: says whether it ran
    """
    patched = _run("from gevent import monkey; monkey.patch_all()\n" + textwrap.dedent(probe))
    assert patched == ["False", "False", "0", "True", "False", "first", "True", "False"]
    threads = _run(probe)
    assert threads == ["False", "False", "0", "False", "False", "-", "False", "False"]


def test_a_gevent_gateway_encodes_the_request_side_during_the_upstream_wait(redis_url: str, tmp_path: Path) -> None:
    code = """
        from gevent import monkey; monkey.patch_all()
        import io, json, os, sys
        import gevent
        from mock_pool import MockPool, vllm_answer
        from polar_mq import record_codec
        from polar_mq.proxy_app.app import create_app
        from polar_mq.proxy_app.fastpath import BODY_IN_MEMORY
        from polar_mq.settings import GatewaySettings

        events = []
        prepare = record_codec.Encoder.prepare
        def traced(self, record):
            events.append("prepared " + record.call_id)
            prepare(self, record)
        record_codec.Encoder.prepare = traced

        def answer(body):
            events.append("upstream asked")
            gevent.sleep(0.02)  # the upstream generates: this greenlet waits
            events.append("upstream answered")
            return vllm_answer(body, "hello there", prompt_ids=list(range(600)), completion_ids=[7, 8])

        settings = GatewaySettings(upstreams=["mock://vllm"], redis_url=os.environ["REDIS_URL"],
                                   served_model="mock-model", spool_dir=os.environ["SPOOL"],
                                   public_url="http://gw.test")
        app = create_app(settings, pool=MockPool(answer), startup_checks=False)
        client = app.test_client()
        session = client.post("/sessions", json={"task_id": "while-waiting"}).get_json()
        body = json.dumps({"model": "m", "max_tokens": 4, "system": "be brief " * 40,
                           "messages": [{"role": "user", "content": "hi " * 100}]}).encode()
        environ = {"REQUEST_METHOD": "POST", "PATH_INFO": f"/s/{session['key']}/v1/messages",
                   "QUERY_STRING": "", "CONTENT_TYPE": "application/json",
                   "CONTENT_LENGTH": str(len(body)), "wsgi.input": io.BytesIO(body), BODY_IN_MEMORY: True}
        status = []
        result = app.wsgi_app(environ, lambda s, h, e=None: status.append(s))
        b"".join(result)
        result.close()
        calls = client.get(f"/sessions/{session['session_id']}/calls").get_json()["calls"]
        print(json.dumps({"status": status[0], "events": events, "calls": calls}))
    """
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120,
                         cwd=TESTS.parent, env={**os.environ, "PYTHONPATH": f"{TESTS.parent}:{TESTS}",
                                                "REDIS_URL": redis_url, "SPOOL": str(tmp_path / "spool")})
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["status"] == "200 OK"
    [call] = seen["calls"]
    assert seen["events"] == ["upstream asked", f"prepared {call['call_id']}", "upstream answered"]
    assert call["request"]["messages"] == [{"role": "user", "content": "hi " * 100}]
    assert call["messages"][0] == {"role": "system", "content": "be brief " * 40}
    assert call["prompt_token_ids"] == list(range(600)) and call["completion_token_ids"] == [7, 8]
