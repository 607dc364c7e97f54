"""Typed hand-offs and import boundaries (issue 11): one list of session states, records out of
the stages' gateway client, and a rollout API process that does not load the stage code.

Cheap: one subprocess import check and one call through the suite's shared gateway.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import openai

from tests.support.servers import TOKEN
from polar_mq import client, states
from polar_mq.cli import client_commands as client_cli
from polar_mq.api.openapi import SESSION_STATES
from polar_mq.model import TERMINAL_STATES, CaptureRecord, RuntimeHandle, SessionRecord, SessionState
from polar_mq.store.core import pack, unpack
from polar_mq.tasks.app.context import GatewayClient

# Loaded by the stages only: the API must not pay for (or break on) harnesses, runtimes, graders.
STAGE_ONLY = ("polar_mq.tasks.worker.stages", "polar_mq.tasks.worker.main", "polar_mq.harnesses", "polar_mq.graders",
              "polar_mq.runtimes")


def test_one_list_of_session_states() -> None:
    assert [s.value for s in SessionState] == SESSION_STATES == list(client_cli.STATE_ORDER)
    assert client.TERMINAL_STATES == states.TERMINAL == frozenset(TERMINAL_STATES)
    assert states.READY == "READY" and json.dumps([states.ERROR]) == '["ERROR"]'
    assert all(states.can_move(s, states.ERROR) for s in SessionState if s not in TERMINAL_STATES)


def test_rollout_api_does_not_import_stage_code() -> None:
    probe = ("import importlib, pkgutil, sys, polar_mq.api as api\n"
             "for m in pkgutil.iter_modules(api.__path__): importlib.import_module('polar_mq.api.' + m.name)\n"
             "from polar_mq.api.app import create_app\n"
             "from polar_mq.api.context import ApiContext\n"
             "import polar_mq.tasks.app.routing, polar_mq.tasks.app.celery, polar_mq.tasks.app.context\n"
             "print('\\n'.join(sorted(sys.modules)))")
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.split()
    assert {"polar_mq.api.routes", "polar_mq.tasks.app.endings", "polar_mq.tasks.app.routing"} <= set(loaded)
    assert [m for m in loaded if m.startswith(STAGE_ONLY)] == []


def test_gateway_client_calls_are_capture_records(gateway: Any, session: dict[str, Any]) -> None:
    chat = openai.OpenAI(base_url=session["base_urls"]["openai"], api_key=session["key"], max_retries=0)
    chat.chat.completions.create(model="m", messages=[{"role": "user", "content": "hello"}], max_tokens=8)
    calls = GatewayClient(gateway.url, TOKEN).calls(session["session_id"])
    assert len(calls) == 1 and isinstance(calls[0], CaptureRecord)
    assert calls[0].session_id == session["session_id"] and calls[0].completion_token_ids
    assert calls[0].to_dict() == CaptureRecord.from_dict(gateway.calls(session["session_id"])[0]).to_dict()
    assert GatewayClient(gateway.url, TOKEN).calls("no-such-session") == []


# A handle as workers stored it before RuntimeHandle (a plain dict, stamped with its host), plus a key a newer
# version might add: it loads into the typed handle and goes back to the same dict.
OLD_BWRAP_HANDLE = {"backend": "bwrap", "session_dir": "/s/t/s1", "workdir": "/s/t/s1/work", "home": "/s/t/s1/home",
                    "env": {"A": "1"}, "cwd": "/s/t/s1/work", "allow_internet": False, "gpus": 0,
                    "host": "node-a", "pgid": 4242, "from_the_future": {"x": 1}}


def test_runtime_handle_reads_and_writes_the_stored_dicts() -> None:
    handle = RuntimeHandle.from_dict(OLD_BWRAP_HANDLE)
    assert (handle.backend, handle.pgid, handle.host, handle.allow_internet) == ("bwrap", 4242, "node-a", False)
    assert handle.to_dict() == OLD_BWRAP_HANDLE
    local = RuntimeHandle(backend="local", session_dir="/s", workdir="/s/work", home="/s/home")
    assert local.to_dict() == {"backend": "local", "session_dir": "/s", "workdir": "/s/work", "home": "/s/home",
                               "env": {}}  # no None fields: a local handle stays the dict it was
    assert handle.is_here("node-a") and not handle.is_here("node-b") and local.is_here("anywhere")
    assert local.stamped("n1").host == "n1" and local.host is None  # copies, never edits in place


def test_session_record_keeps_its_runtime_typed_through_redis_form() -> None:
    old = SessionRecord(session_id="s1", task_id="t").to_dict()
    assert old["runtime"] == {}  # "no runtime" is stored as it always was
    assert SessionRecord.from_dict(old).runtime is None
    rec = SessionRecord.from_dict({**old, "runtime": OLD_BWRAP_HANDLE})
    assert isinstance(rec.runtime, RuntimeHandle) and rec.runtime_host == "node-a"
    assert rec.runtime_is_here("node-a") and not rec.runtime_is_here("node-b")
    assert SessionRecord.from_dict(old).runtime_is_here("node-b")  # nothing started: nothing to defer to
    assert unpack(pack(rec.to_dict()))["runtime"] == OLD_BWRAP_HANDLE


def test_task_names_and_queues_come_from_routing() -> None:
    from polar_mq.tasks.app import routing
    from polar_mq.tasks.worker import main as worker

    assert set(routing.STAGE_QUEUE) <= set(worker.app.tasks)  # every routed name is a defined task
    assert worker.app.conf.task_routes == routing.task_routes()
    assert {q.name for q in worker.app.conf.task_queues} == set(routing.QUEUES) == set(routing.STAGE_QUEUE.values())


def test_worker_entry_points_use_the_cli_defaults() -> None:
    from polar_mq.cli import commands as cli
    from polar_mq.tasks.app.routing import QUEUES

    assert cli.STAGES == QUEUES
    from polar_mq.cli import slots

    run = cli.worker_defaults("run", {})
    assert run["pool"] == "threads" and run["loglevel"] == "INFO"
    assert run["concurrency"] == slots.concurrency_for("run", "threads", slots.host())
    env = {"POLAR_INIT_CONCURRENCY": "8", "POLAR_LOG_LEVEL": "DEBUG", "POLAR_CELERY_POOL": "prefork"}
    assert cli.worker_defaults("init", env) == {"concurrency": 8, "loglevel": "DEBUG", "pool": "prefork"}
    assert cli.worker_defaults("run", {"POLAR_CELERY_POOL": "prefork"})["concurrency"] >= cli.STAGE_CONCURRENCY["run"]
    up = cli.build_parser().parse_args(["up"])  # None: `up` sizes each pool as the worker would
    assert (up.init_concurrency, up.run_concurrency, up.postrun_concurrency) == (None, None, None)
    # workers/<stage>.py is `polar-mq worker --stage <stage>` and nothing else
    probe = ("import sys; sys.path.insert(0, 'workers'); import workers_common, polar_mq.cli.commands as c\n"
             "c.main = lambda argv: print(argv) or 0; workers_common.main = c.main\n"
             "workers_common.run_stage('postrun')")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['worker', '--stage', 'postrun']"


def test_each_harness_is_one_module_named_by_the_task_spec(tmp_path: Any) -> None:
    from polar_mq.harnesses import install, registry
    from polar_mq.taskspec import HARNESSES

    for name in HARNESSES:
        module = registry.harness_module(name)
        assert module.__name__ == f"polar_mq.harnesses.{name}" and module.HARNESS.name == name
    for name in registry.CLI_HARNESSES:
        harness = registry.cli_harness(name)
        assert harness.package.name == name and install.PACKAGES[name] is harness.package
        assert harness.apis and harness.apis[0] == harness.build(tmp_path / name, {
            "openai": "http://g/v1", "anthropic": "http://g", "gemini": "http://g"}, "k", "m", "hi").api


def test_redis_replies_are_read_as_bytes_and_a_decoding_client_is_refused() -> None:
    import pytest

    from polar_mq.store import replies

    assert replies.text(b"sid") == "sid" and replies.blob(None) is None and replies.text(None) is None
    assert replies.texts([b"a", b"b"]) == ["a", "b"] and replies.text_map({b"k": b"v"}) == {"k": b"v"}
    assert replies.scored([(b"gw", 3)]) == [("gw", 3.0)]
    with pytest.raises(TypeError, match="decode_responses"):
        replies.text("sid")  # what a decode_responses=True client would hand back
