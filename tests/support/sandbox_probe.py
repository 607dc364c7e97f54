"""Run inside a session's sandbox by tests/trust/test_trust_sandbox.py: tries to reach everything it must
not, and its own session's model endpoint, then writes what happened to ./probe.json.

Inputs (the task's runtime.env): PROBE_API, PROBE_REDIS, PROBE_FLOWER (host:port), PROBE_OTHER_KEY
(another session's key, as if it had leaked), PROBE_TOKEN_FILE, PROBE_OTHER_DIR."""

from __future__ import annotations

import json
import os
import socket
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

out: dict[str, object] = {}
openai_base = os.environ["OPENAI_BASE_URL"]  # http://127.0.0.1:P/s/<key>/v1
key = os.environ["OPENAI_API_KEY"]
gw = urlsplit(openai_base)
root = f"{gw.scheme}://{gw.netloc}"
chat = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi polar:notool"}]}


def http(url: str, body: dict | None = None, headers: dict | None = None) -> object:
    req = urllib.request.Request(url, data=None if body is None else json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError as exc:
        return f"unreachable: {exc}"


def tcp(hostport: str) -> str:
    host, _, port = hostport.rpartition(":")
    try:
        socket.create_connection((host, int(port)), 3).close()
        return "CONNECTED"
    except OSError as exc:
        return f"refused: {exc}"


out["own_chat"] = http(f"{openai_base}/chat/completions", chat)
out["own_key_as_header"] = http(f"{root}/v1/chat/completions", chat, {"Authorization": f"Bearer {key}"})
out["sessions_list"] = http(f"{root}/sessions/x/calls", headers={"Authorization": f"Bearer {key}"})
out["sessions_create"] = http(f"{root}/sessions", {"session_id": "steal"})
out["gateway_health"] = http(f"{root}/health")
other = os.environ["PROBE_OTHER_KEY"]
out["other_in_url"] = http(f"{root}/s/{other}/v1/chat/completions", chat)
out["other_as_header"] = http(f"{root}/v1/chat/completions", chat, {"x-api-key": other})
out["other_as_query"] = http(f"{root}/v1beta/models/m:generateContent?key={other}",
                             {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]})
out["api"] = tcp(os.environ["PROBE_API"])
out["redis"] = tcp(os.environ["PROBE_REDIS"])
out["flower"] = tcp(os.environ["PROBE_FLOWER"])
out["internet"] = tcp("1.1.1.1:80")

# Request smuggling: an allowed request with a second one (for /sessions) behind it on the same
# connection. The bridge forwards exactly one request, so exactly one answer comes back.
s = socket.create_connection((gw.hostname, gw.port), 10)
one = json.dumps(chat).encode()
s.sendall(f"POST {gw.path}/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
          f"Content-Length: {len(one)}\r\n\r\n".encode() + one +
          b"GET /sessions/x/calls HTTP/1.1\r\nHost: x\r\n\r\n")
answer = b""
s.settimeout(10)
try:
    while True:
        piece = s.recv(65536)
        if not piece:
            break
        answer += piece
except OSError:
    pass
out["smuggle_answers"] = answer.count(b"HTTP/1.1 ")

for name, path in (("token_file", os.environ["PROBE_TOKEN_FILE"]), ("other_dir", os.environ["PROBE_OTHER_DIR"])):
    try:
        out[name] = "READ: " + (Path(path).read_text()[:20] if Path(path).is_file() else str(os.listdir(path)))
    except OSError as exc:
        out[name] = f"hidden: {exc}"
out["docker_socket"] = "VISIBLE" if Path("/run/docker.sock").exists() or Path("/var/run/docker.sock").exists() \
    else "hidden"
Path("probe.json").write_text(json.dumps(out, indent=1))
print(json.dumps(out, indent=1))
