"""A gateway started under a soft open-files limit of 1024 (a login shell's, a systemd service's)
raises it toward the hard limit before its workers fork: each concurrent call holds a client and an
upstream socket, so 1024 would refuse connections from ~500 concurrent calls on, below the
1,024 sessions one deployment runs (bench/bench_soak.py --hosts 4 --sessions 1024)."""

from __future__ import annotations

import resource
import subprocess
import sys
import time
from pathlib import Path

from polar_mq.cli.embedded_redis import free_port
from polar_mq.settings import GatewaySettings
from tests.support.servers import spawn, stop


def soft_nofile(pid: int) -> int:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            return int(line.split()[3])
    raise AssertionError("no open-files line")


def test_gateway_raises_its_open_files_limit(log_dir, redis_url, model_server) -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 256 + 2 * GatewaySettings().worker_connections
    expect = want if hard == resource.RLIM_INFINITY else min(hard, want)
    assert expect > 1024, "the hard limit here leaves nothing to raise"
    port = free_port()
    server = spawn(["bash", "-c", 'ulimit -Sn 1024 && exec "$@"', "gw", sys.executable, "-m", "polar_mq.cli",
                    "gateway", "--host", "127.0.0.1", "--port", str(port), "--redis", redis_url,
                    "--upstream", model_server, "--workers", "1"],
                   f"http://127.0.0.1:{port}/health", log_dir, f"gateway-fd-{port}",
                   env={"POLAR_SPOOL_DIR": str(log_dir / f"spool-{port}")})
    try:
        deadline = time.time() + 10
        workers: list[int] = []
        while not workers and time.time() < deadline:
            workers = [int(c) for c in Path(f"/proc/{server.proc.pid}/task/{server.proc.pid}/children")
                       .read_text().split()]
            time.sleep(0.05)
        assert workers, "no gunicorn worker"
        assert soft_nofile(server.proc.pid) == expect  # the master, before it forked
        assert all(soft_nofile(w) == expect for w in workers)  # its workers inherit it
    finally:
        stop(server.proc)
