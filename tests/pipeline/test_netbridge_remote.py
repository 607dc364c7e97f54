"""A sandbox without a network reaches a gateway on *another host* through its per-session
forwarder (netbridge.sandbox_forwards / sandbox_urls), and nothing else of that host's network.

The "other host" is a network namespace made by the test (root) serving HTTP on 10.78.x.2; the
worker host is this namespace; the sandbox is bwrap's private network namespace."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import uuid

import pytest
import requests

from polar_mq.runtimes.bwrap import BwrapRuntime
from polar_mq.runtimes.netbridge import sandbox_forwards, sandbox_urls
from polar_mq.taskspec import RuntimeSpec

pytestmark = [pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed"),
              pytest.mark.skipif(os.geteuid() != 0 or shutil.which("ip") is None,
                                 reason="needs root and iproute2 to make the remote host's namespace")]

PROBE = r"""
import sys, urllib.request
for url in sys.argv[1:]:
    try:
        print("GOT", url, urllib.request.urlopen(url, timeout=3).read().decode().strip())
    except OSError as exc:
        print("FAILED", url, type(exc).__name__)
"""


def sh(*args: str) -> None:
    subprocess.run(list(args), check=True, capture_output=True)


@pytest.fixture()
def remote_host(tmp_path):
    tag = uuid.uuid4().hex[:5]
    ns, veth = f"pmq{tag}gw", f"pmq{tag}g"
    sh("ip", "netns", "add", ns)
    proc = None
    try:
        sh("ip", "link", "add", f"{veth}a", "type", "veth", "peer", "name", f"{veth}b")
        sh("ip", "link", "set", f"{veth}b", "netns", ns)
        sh("ip", "addr", "add", "10.78.0.1/24", "dev", f"{veth}a")
        sh("ip", "link", "set", f"{veth}a", "up")
        sh("ip", "-n", ns, "addr", "add", "10.78.0.2/24", "dev", f"{veth}b")
        sh("ip", "-n", ns, "link", "set", f"{veth}b", "up")
        sh("ip", "-n", ns, "link", "set", "lo", "up")
        (tmp_path / "www").mkdir()
        (tmp_path / "www" / "health").write_text("gateway-on-another-host\n")
        proc = subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-m", "http.server", "8611",
                                 "--bind", "10.78.0.2", "--directory", str(tmp_path / "www")],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 15
        while True:
            try:
                requests.get("http://10.78.0.2:8611/health", timeout=0.5)
                break
            except requests.RequestException:
                if time.time() > deadline:
                    raise
                time.sleep(0.1)
        yield "http://10.78.0.2:8611"
    finally:
        if proc is not None:
            proc.kill()
            proc.wait()
        subprocess.run(["ip", "link", "del", f"{veth}a"], capture_output=True)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def test_forwards_map_remote_gateways_onto_the_sandbox_loopback():
    fws = sandbox_forwards(["http://10.0.0.5:8600/s/k/v1", "http://10.0.0.5:8600/s/k", "http://10.0.0.6:8600/x",
                            "http://127.0.0.1:9000/s/k"])
    assert [(f.listen_host, f.port, f.target_host, f.target_port) for f in fws] == [
        ("127.0.0.1", 8600, "10.0.0.5", 8600), ("127.0.0.1", 8601, "10.0.0.6", 8600),
        ("127.0.0.1", 9000, "127.0.0.1", 9000)]
    assert sandbox_urls({"openai": "http://10.0.0.5:8600/s/k/v1", "local": "http://127.0.0.1:9000/s/k"}) == {
        "openai": "http://127.0.0.1:8600/s/k/v1", "local": "http://127.0.0.1:9000/s/k"}


def test_sandbox_reaches_a_remote_gateway_only_through_its_forwarder(remote_host, tmp_path):
    rt = BwrapRuntime()
    handle = rt.start(RuntimeSpec(backend="bwrap"), tmp_path / "s", "sess-remote")
    base_urls = {"openai": f"{remote_host}/v1"}
    handle = handle.updated(gateway_urls=list(base_urls.values()))
    assert rt.bridges_gateway(handle)
    forwarded = sandbox_urls(base_urls)["openai"].removesuffix("/v1") + "/health"
    r = rt.exec(handle, [sys.executable, "-c", PROBE, forwarded, f"{remote_host}/health"], env={}, timeout=30,
                log_path=tmp_path / "s" / "logs" / "probe.log")
    out = r.output_tail
    assert r.exit_code == 0, out
    assert f"GOT {forwarded} gateway-on-another-host" in out, out
    assert f"FAILED {remote_host}/health" in out, out  # the host's network stays out of the sandbox
