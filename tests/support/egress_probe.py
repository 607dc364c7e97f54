"""Run inside an allow_internet sandbox by tests/trust/test_trust_sandbox.py: connects to each
PROBE_TARGETS entry (JSON {name: "host:port"}) and calls its own session's model endpoint
(OPENAI_BASE_URL, the forwarded loopback URL); prints one JSON line, {name: "CONNECTED <first
bytes>" | "refused: <error>", "own_chat": <HTTP status>}."""

from __future__ import annotations

import json
import os
import socket
import urllib.error
import urllib.request

out: dict[str, object] = {}
# First try to undo the blocks (bwrap: prohibit routes in the sandbox's netns); then probe.
import subprocess  # noqa: E402

try:
    got = subprocess.run(["ip", "route", "del", "169.254.0.0/16"], capture_output=True, text=True, timeout=10)
    out["route_del"] = "removed" if got.returncode == 0 else f"refused: {got.stderr.strip()}"
except OSError as exc:
    out["route_del"] = f"refused: {exc}"
for name, hostport in json.loads(os.environ["PROBE_TARGETS"]).items():
    host, _, port = hostport.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), 5) as s:
            s.settimeout(0.5)  # the outside listener greets at once; hub services say nothing first
            try:
                first = s.recv(64).decode(errors="replace")
            except OSError:
                first = ""
        out[name] = f"CONNECTED {first}".strip()
    except OSError as exc:
        out[name] = f"refused: {exc}"
chat = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi polar:notool"}]}
req = urllib.request.Request(f"{os.environ['OPENAI_BASE_URL']}/chat/completions", data=json.dumps(chat).encode(),
                             headers={"Content-Type": "application/json"})
try:
    with urllib.request.urlopen(req, timeout=30) as resp:
        out["own_chat"] = resp.status
except urllib.error.HTTPError as exc:
    out["own_chat"] = exc.code
except OSError as exc:
    out["own_chat"] = f"unreachable: {exc}"
try:
    out["resolv"] = open("/etc/resolv.conf").read().strip()
except OSError as exc:
    out["resolv"] = f"unreadable: {exc}"
print("PROBE " + json.dumps(out), flush=True)
if os.environ.get("PROBE_OUT"):  # run as a session's harness: the test reads it from the work dir
    with open(os.environ["PROBE_OUT"], "w") as fh:
        json.dump(out, fh)
