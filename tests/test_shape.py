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

from conftest import TOKEN
from polar_mq import client, client_cli, states
from polar_mq.api.openapi import SESSION_STATES
from polar_mq.model import TERMINAL_STATES, CaptureRecord, SessionState
from polar_mq.tasks.context import GatewayClient

# Loaded by the stages only: the API must not pay for (or break on) harnesses, runtimes, graders.
STAGE_ONLY = ("polar_mq.tasks.stages", "polar_mq.harnesses", "polar_mq.graders", "polar_mq.runtimes.docker",
              "polar_mq.runtimes.local", "polar_mq.runtimes.bwrap", "polar_mq.runtimes.apptainer")


def test_one_list_of_session_states() -> None:
    assert [s.value for s in SessionState] == SESSION_STATES == list(client_cli.STATE_ORDER)
    assert client.TERMINAL_STATES == states.TERMINAL == frozenset(TERMINAL_STATES)
    assert states.READY == "READY" and json.dumps([states.ERROR]) == '["ERROR"]'
    assert all(states.can_move(s, states.ERROR) for s in SessionState if s not in TERMINAL_STATES)


def test_rollout_api_does_not_import_stage_code() -> None:
    probe = ("import importlib, pkgutil, sys, polar_mq.api as api\n"
             "for m in pkgutil.iter_modules(api.__path__): importlib.import_module('polar_mq.api.' + m.name)\n"
             "from polar_mq.api.app import create_app\n"
             "print('\\n'.join(sorted(sys.modules)))")
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.split()
    assert "polar_mq.api.routes" in loaded and "polar_mq.tasks.endings" in loaded
    assert [m for m in loaded if m.startswith(STAGE_ONLY)] == []


def test_gateway_client_calls_are_capture_records(gateway: Any, session: dict[str, Any]) -> None:
    chat = openai.OpenAI(base_url=session["base_urls"]["openai"], api_key=session["key"], max_retries=0)
    chat.chat.completions.create(model="m", messages=[{"role": "user", "content": "hello"}], max_tokens=8)
    calls = GatewayClient(gateway.url, TOKEN).calls(session["session_id"])
    assert len(calls) == 1 and isinstance(calls[0], CaptureRecord)
    assert calls[0].session_id == session["session_id"] and calls[0].completion_token_ids
    assert calls[0].to_dict() == CaptureRecord.from_dict(gateway.calls(session["session_id"])[0]).to_dict()
    assert GatewayClient(gateway.url, TOKEN).calls("no-such-session") == []
