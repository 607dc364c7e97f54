"""idle_socket: the one-syscall checks the gateway makes on pooled upstream/Redis connections
(open and quiet?) and on its clients' connections (gone?), with and without gevent, also on
descriptors >= 1024 (select.select refuses those; a gateway holding 1,024 streams has them)."""

from __future__ import annotations

import subprocess
import sys

import pytest

PROBE = """
import os, resource, socket
from polar_mq._io.idle_socket import has_data, idle_and_open, peer_closed
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
if soft < 1200:
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096), hard))
filler = [os.dup(0) for _ in range(1030)] if HIGH else []  # push the pair's descriptors past 1023
a, b = socket.socketpair()
assert (a.fileno() >= 1024) == HIGH
a.settimeout(30)  # a timeout must not make the checks wait
row = [idle_and_open(a), peer_closed(a), has_data(a)]
b.sendall(b"x"); row += [idle_and_open(a), peer_closed(a), has_data(a)]; a.recv(1)
b.close(); row += [idle_and_open(a), peer_closed(a), has_data(a)]
print(*row)
"""


@pytest.mark.parametrize("high", [False, True], ids=["low-fd", "fd>=1024"])
@pytest.mark.parametrize("gevent", [False, True], ids=["threads", "gevent"])
def test_checks_tell_quiet_pending_and_closed_apart(gevent: bool, high: bool) -> None:
    import resource

    if high and resource.getrlimit(resource.RLIMIT_NOFILE)[1] < 2048:
        pytest.skip("the hard limit on open files is below 2048 here")
    code = ("from gevent import monkey; monkey.patch_all()\n" if gevent else "") + f"HIGH = {high}\n" + PROBE
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    # quiet: open, not closed, nothing to read; data waiting: not idle, not closed, to read;
    # peer gone: not open, closed, a read returns at once (the end)
    assert out.stdout.split() == ["True", "False", "False",  # quiet
                                  "False", "False", "True",  # data waiting
                                  "False", "True", "True"], out.stderr
