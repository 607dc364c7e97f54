"""POLAR_REQUIRE_ALL=1 (.ci/run) turns a skip into a failure, except `full` cases and environment
variants; without it a missing prerequisite skips with its reason (tests/conftest.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CASES = '''
import pytest
from tests.conftest import FULL_SKIP

def test_missing_prerequisite():
    pytest.skip("no Docker engine: dockerd needs root")

@pytest.mark.skipif(True, reason="bubblewrap not installed")
def test_marked_missing():
    pass

@pytest.mark.skip(reason=FULL_SKIP)
def test_full_case():
    pass

@pytest.mark.skipif(True, reason="variant: privileged, tested above")
def test_other_environment():
    pass

def test_passes():
    pass
'''


def _run(tmp_path: Path, require_all: str | None) -> str:
    (tmp_path / "conftest.py").write_text("from tests.conftest import pytest_runtest_makereport  # noqa: F401\n")
    (tmp_path / "test_cases.py").write_text(CASES)
    env = {k: v for k, v in os.environ.items() if k != "POLAR_REQUIRE_ALL"}
    env["PYTHONPATH"] = str(ROOT)
    if require_all is not None:
        env["POLAR_REQUIRE_ALL"] = require_all
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", "-c", os.devnull,
                          "--rootdir", str(tmp_path), str(tmp_path / "test_cases.py")],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    return out.stdout + out.stderr


def test_in_ci_a_missing_prerequisite_fails(tmp_path):
    out = _run(tmp_path, "1")
    # a skip in the test body fails it; a skipif marker fails its setup (an error): both fail the run
    assert "1 failed, 1 passed, 2 skipped, 1 error" in out, out
    assert "FAILED" in out and "POLAR_REQUIRE_ALL=1): no Docker engine: dockerd needs root" in out, out
    assert "POLAR_REQUIRE_ALL=1): bubblewrap not installed" in out, out


def test_elsewhere_it_skips_with_its_reason(tmp_path):
    out = _run(tmp_path, None)
    assert "1 passed, 4 skipped" in out, out
    assert "no Docker engine: dockerd needs root" in out
