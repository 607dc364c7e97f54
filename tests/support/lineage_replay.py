"""Replay a lineage fixture (tests/replays/lineage/<harness>/<scenario>.json, written by
scripts/record_lineage.py) into a fresh gateway session in front of the stand-in run with the
fixture's own script and window, so every answer is the one the CLI got when it was recorded and
the capture records, chains and lineage are the real CLI's. Used by
tests/merge/test_lineage_replays.py and bench/bench_lineage.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

import requests

LINEAGE_REPLAYS = Path(__file__).resolve().parents[1] / "replays" / "lineage"
REPLAY_KEY = "REPLAY_KEY"


def fixtures() -> list[Path]:
    return sorted(LINEAGE_REPLAYS.glob("*/*.json"))


def load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def write_script(fixture: Mapping[str, Any], dest: Path) -> Path:
    dest.write_text(json.dumps(fixture["stand_in"]["script"]))
    return dest


def replay(gateway_url: str, fixture: Mapping[str, Any], admin_headers: Mapping[str, str],
           name: str = "") -> str:
    """Send the fixture's requests, in order, into a new session; returns its session id. A model
    call must get the status it got when recorded."""
    sess = requests.post(f"{gateway_url}/sessions", headers=dict(admin_headers),
                         json={"metadata": {"replay": name}}, timeout=10).json()
    key = sess["key"]
    for req in fixture["requests"]:
        data = None
        if req["body"] is not None:
            data = (json.dumps(req["body"]) if req["body_format"] == "json" else req["body"])
            data = data.replace(REPLAY_KEY, key).encode()
        resp = requests.request(req["method"], gateway_url + req["path"].replace(REPLAY_KEY, key), data=data,
                                headers={k: v.replace(REPLAY_KEY, key) for k, v in req["headers"].items()},
                                timeout=120)
        resp.content  # drain the stream: the record is written when the answer ends
        if req["generation"]:
            assert resp.status_code == req["recorded_status"], (name, req["path"], resp.text[:300])
    return sess["session_id"]


def trajectory(gateway_url: str, session_id: str, admin_headers: Mapping[str, str],
               builder: str = "prefix_merging") -> dict[str, Any]:
    resp = requests.get(f"{gateway_url}/sessions/{session_id}/trajectory", headers=dict(admin_headers),
                        params={"builder": builder}, timeout=120)
    resp.raise_for_status()
    return resp.json()
