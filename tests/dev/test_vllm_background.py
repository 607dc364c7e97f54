"""The test vLLM is lowered to the lowest CPU priority around the tests that time the gateway while
it generates (scripts/vllm_cpu.py `lowered`): on a 2-core box its worker otherwise starved the
gateway for seconds, and no cancel could reach it (tests/vllm/test_abort_vllm.py). Checked on a
stand-in process in its own session, as the suite starts vLLM."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from examples.grpo.vllm_policy import vllm_cpu as _load_vllm_cpu

vllm_cpu = _load_vllm_cpu()  # scripts/vllm_cpu.py, loaded by path as the example and tests/vllm do


def _autogroup(pid: int | str) -> str | None:
    try:
        return Path(f"/proc/{pid}/autogroup").read_text()
    except OSError:
        return None


@pytest.mark.skipif(_autogroup("self") is None, reason="this kernel has no autogroups")
@pytest.mark.skipif(not vllm_cpu._can_raise_priority(), reason="variant: unprivileged, `lowered` leaves the server as it is "
                    "(tested below), since it could not put its priority back")
def test_lowered_sets_the_servers_autogroup_and_puts_it_back():
    mine = _autogroup("self")
    server = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        before = _autogroup(server.pid)
        assert before is not None and before != mine  # its own session: its own group
        with vllm_cpu.lowered(server.pid) as done:
            assert done
            assert _autogroup(server.pid).split("nice")[-1].strip() == str(vllm_cpu.BACKGROUND_NICE)
            assert _autogroup("self") == mine  # the caller's group is untouched
        assert _autogroup(server.pid) == before
    finally:
        server.kill()
        server.wait()


def test_lowered_without_the_process_changes_nothing():
    server = subprocess.Popen(["true"], start_new_session=True)
    server.wait()
    with vllm_cpu.lowered(server.pid) as done:
        assert done is False


@pytest.mark.skipif(vllm_cpu._can_raise_priority(), reason="variant: privileged, tested above")
def test_unprivileged_lowered_leaves_the_server_as_it_is():
    server = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        before = _autogroup(server.pid)
        with vllm_cpu.lowered(server.pid) as done:
            assert done is False and _autogroup(server.pid) == before
        assert _autogroup(server.pid) == before
    finally:
        server.kill()
        server.wait()
