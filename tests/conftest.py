"""Session fixtures (a real redis-server, the stand-in model server, the gateway), the `full`
marker, and skips that must not pass in CI. The helpers they use live in tests/support/servers.py."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest

from polar_mq.cli.embedded_redis import start_embedded

from tests.support.servers import FULL, GatewayHandle, start_gateway, start_model_server, stop


FULL_SKIP = "more of a suite the default run covers with one case: POLAR_FULL=1 runs it"
VARIANT = "variant:"  # a skip reason's prefix: the case is for another environment, tested in its twin


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """With POLAR_REQUIRE_ALL=1 (.ci/run sets it: it installs every prerequisite) a skip is a
    failure, except `full` cases and environment variants: a suite that skipped there would hide
    a broken install. On a developer's machine a missing prerequisite skips with its reason
    (README, "Two commands"). tests/cli/test_require_all.py guards it."""
    outcome = yield
    rep = outcome.get_result()
    if not rep.skipped or os.environ.get("POLAR_REQUIRE_ALL") != "1" or hasattr(rep, "wasxfail"):
        return
    reason = rep.longrepr[2] if isinstance(rep.longrepr, tuple) else str(rep.longrepr)
    reason = reason.removeprefix("Skipped: ")
    if reason == FULL_SKIP or reason.startswith(VARIANT):
        return
    rep.outcome = "failed"
    rep.longrepr = f"skipped where every prerequisite must be present (POLAR_REQUIRE_ALL=1): {reason}"


def pytest_collection_modifyitems(config, items):
    """`@pytest.mark.full` cases run only with POLAR_FULL=1 or when `-m` names `full`: each such
    suite keeps at least one real end-to-end case in the default run (README, "Tests")."""
    if FULL or "full" in (config.getoption("markexpr") or ""):
        return
    skip = pytest.mark.skip(reason=FULL_SKIP)
    for item in items:
        if item.get_closest_marker("full") is not None:
            item.add_marker(skip)



@pytest.fixture(scope="session")
def log_dir() -> Path:
    path = Path(tempfile.mkdtemp(prefix="polar-test-logs-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)



@pytest.fixture(scope="session")
def redis_server():
    server = start_embedded()
    yield server
    server.stop()



@pytest.fixture(scope="session")
def redis_url(redis_server) -> str:
    return redis_server.url



@pytest.fixture(scope="session")
def model_server(log_dir) -> str:
    server = start_model_server(log_dir, "--max-model-len", "65536")
    yield server.url
    stop(server.proc)



@pytest.fixture(scope="session")
def gateway(log_dir, redis_url, model_server) -> GatewayHandle:
    server = start_gateway(log_dir, redis_url, [model_server])
    yield GatewayHandle(url=server.url, upstream_url=model_server, redis_url=redis_url, server=server)
    stop(server.proc)



@pytest.fixture()
def session(gateway) -> dict[str, Any]:
    """A fresh gateway session for one test."""
    return gateway.new_session()
