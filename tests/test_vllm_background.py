"""The test vLLM runs at the lowest CPU priority (scripts/vllm_cpu.py in_background): on a 2-core
box its worker otherwise starved the gateway for seconds while it generated, and no cancel could
reach it (tests/vllm/test_abort_vllm.py). Checked with a stand-in command in its own session."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from examples.grpo.vllm_policy import vllm_cpu as _load_vllm_cpu

vllm_cpu = _load_vllm_cpu()  # scripts/vllm_cpu.py, loaded by path as the example and tests/vllm do


def test_in_background_lowers_the_task_and_its_autogroup():
    probe = ["sh", "-c", 'nice; cat /proc/self/autogroup 2>/dev/null || echo "no autogroup"; echo "$0 $1"', "a b", "c"]
    proc = subprocess.run(vllm_cpu.in_background(probe), capture_output=True, text=True,
                          start_new_session=True, timeout=10)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == str(min(19, os.nice(0) + vllm_cpu.BACKGROUND_NICE))
    if lines[1] != "no autogroup":  # a kernel with autogroups: the new session's group is lowered
        assert lines[1].endswith(f"nice {vllm_cpu.BACKGROUND_NICE}"), lines[1]
    assert lines[2] == "a b c"  # the command's arguments pass through unchanged


def test_in_background_leaves_the_callers_autogroup_alone_without_a_new_session():
    before = _autogroup()
    proc = subprocess.run(vllm_cpu.in_background(["nice"]), capture_output=True, text=True, timeout=10)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(min(19, os.nice(0) + vllm_cpu.BACKGROUND_NICE))
    assert _autogroup() == before


def _autogroup() -> str | None:
    try:
        return Path("/proc/self/autogroup").read_text()
    except OSError:
        return None
