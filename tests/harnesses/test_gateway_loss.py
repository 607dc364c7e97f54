"""A gateway worker process killed mid-stream under a real Claude Code (issue 38, "gateway loss";
Codex too with POLAR_FULL=1).

The whole path is real: the pipeline's pools (Celery workers) run Claude Code 2.1 in a local
runtime against a gateway of two gunicorn worker processes (one public URL), which streams from
the stand-in model server slowly (`--token-latency-ms`). Once the stand-in has streamed a few
tokens of the session's first call, the gateway worker holding that call (its in-flight entry
names the process: store/lost_calls.py) gets SIGKILL. Checked:

- Claude Code's retry is served on the same gateway session (by the other worker) and the
  session COMPLETES, the file written;
- the killed call ends as exactly one `gateway_lost` error record, and no in-flight entry stays;
- the records match what the upstream served: one ok record per generation the stand-in
  finished, same sampled-token counts, and the one generation it saw aborted is the killed one;
- the trajectory (prefix_merging) keeps every ok call in its main trace, never the lost one,
  and lists the lost call with the call that retried it (merge/lost.py).

Printed (run with -s): kill → retry served, kill → the error record, kill → COMPLETED.
"""

from __future__ import annotations

import os
import signal
import time

import pytest
import redis
import requests

from tests.support.pipeline import agent_task, make_pipeline
from tests.support.servers import GatewayHandle, start_gateway, start_model_server, stop
from polar_mq import states
from polar_mq.cli.embedded_redis import start_embedded
from polar_mq.dev.model_server.tokenizer import load_tokenizer
from polar_mq.harnesses import install
from polar_mq.model import GATEWAY_LOST
from polar_mq.store.core import GatewayStore, Keys
from polar_mq.store.lost_calls import Entry

pytestmark = [pytest.mark.cli,
              pytest.mark.skipif(not install.npm_available(), reason="node/npm not on PATH")]

PROBE_MAX_TOKENS = (1, 2)
TOKEN_LATENCY_MS = "40"  # a tool call of ~40 tokens streams for ~1.6 s: time to kill it mid-way


def cli_bin(name: str) -> str:
    try:
        return str(install.install([name], timeout=900)[name])
    except install.InstallError as exc:
        pytest.skip(f"could not install {name} from npm: {exc}")


def _wait_mid_stream(p, sid: str, r: redis.Redis, keys: Keys, upstream: str, timeout: float = 90.0):
    """(gateway session id, call id, its in-flight entry) once the stand-in streams that call."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rec = p.store.get_session(sid)
        gsid = rec.gateway_session_id if rec is not None else None
        if gsid:
            entries = r.hgetall(keys.session_inflight(gsid))
            gens = requests.get(f"{upstream}/polar/generations", timeout=5).json()
            streaming = gens["running"] and any(g["sent_tokens"] >= 3 for g in gens["recent"]
                                                if g["sent_tokens"] < g["planned_tokens"])
            if len(entries) == 1 and streaming:
                [(call_id, raw)] = entries.items()
                return gsid, call_id.decode(), Entry.parse(raw)
        time.sleep(0.05)
    raise AssertionError(f"no call of {sid} was seen streaming")


@pytest.mark.timeout(600)  # the first run installs the CLI from npm
@pytest.mark.parametrize("harness", ["claude_code", pytest.param("codex", marks=pytest.mark.full)])
def test_a_real_cli_survives_its_gateway_worker_killed_mid_stream(harness, log_dir, tmp_path):
    cli_bin(harness)
    server = start_embedded()
    ms = start_model_server(log_dir, "--max-model-len", "65536", "--token-latency-ms", TOKEN_LATENCY_MS,
                            name="ms-gateway-loss")
    gw = start_gateway(log_dir, server.url, [ms.url], "--workers", "2", "--tito", "on",
                       "--tokenizer", load_tokenizer().path, name="gw-loss")
    handle = GatewayHandle(url=gw.url, upstream_url=ms.url, redis_url=server.url, server=gw)
    p = make_pipeline(handle, tmp_path, redis_server=server)  # one Redis, as `polar-mq up`
    try:
        for stage in ("init", "run", "postrun"):
            p.start_worker(stage)
        r, keys = redis.Redis.from_url(server.url), Keys()
        _, [sid] = p.submit(agent_task(
            num_samples=1, timeout_seconds=150, runtime={"backend": "local"},
            instruction="Create the file polar.txt polar:path=polar.txt",
            agent={"harness": harness, "model": "stand-in", "options": {}}))
        gsid, killed, entry = _wait_mid_stream(p, sid, r, keys, ms.url)
        pid = int(entry.gateway_id.rsplit(":", 2)[1])
        os.kill(pid, signal.SIGKILL)
        t_kill = time.time()

        store = GatewayStore(r, keys)
        retry_at = lost_at = None
        deadline = time.monotonic() + 150
        while time.monotonic() < deadline:
            rec = p.store.get_session(sid)
            calls = store.calls(gsid)
            if retry_at is None and any(c.status == "ok" and c.started_at > t_kill for c in calls):
                retry_at = time.time()
            if lost_at is None and any(c.call_id == killed for c in calls):
                lost_at = time.time()
            if states.is_terminal(rec.state):
                break
            time.sleep(0.1)
        done_at = time.time()
        logf = tmp_path / "sessions"
        harness_log = "\n".join(f.read_text(errors="replace")[-2000:] for f in logf.rglob("harness-*.log"))
        assert rec.state == states.COMPLETED, (rec.state, rec.error, harness_log)
        assert (tmp_path / "sessions").exists()
        assert any(f.read_text().strip() == "hello from polar" for f in logf.rglob("polar.txt")), harness_log

        calls = store.calls(gsid)
        lost = [c for c in calls if c.status == "error"]
        assert [c.call_id for c in lost] == [killed], [(c.call_id, c.status, c.error) for c in calls]
        assert lost[0].error.startswith(GATEWAY_LOST) and entry.gateway_id in lost[0].error
        assert r.hlen(keys.session_inflight(gsid)) == 0
        ok = [c for c in calls if c.status == "ok"]
        retried = [c for c in ok if c.started_at > t_kill]
        assert retried, "the retry was not served on the session"

        # What the upstream served: every generation it finished is an ok record (same sampled
        # token counts), and the one it saw aborted (its client, the killed worker, went away)
        # is the lost call, admitted before the kill.
        gens = requests.get(f"{ms.url}/polar/generations", timeout=5).json()
        assert gens["running"] == 0
        assert gens["finished"].get("abort") == 1 and len(gens["aborted"]) == 1, gens
        [aborted] = gens["aborted"]
        assert 3 <= aborted["sent_tokens"] < aborted["planned_tokens"]
        assert lost[0].started_at <= aborted["started_at"] <= t_kill
        # (each gateway worker's start-up probes of the upstream are generations too, of 1 or 2
        # tokens: upstream/pool.py)
        served = sorted(g["sent_tokens"] for g in gens["recent"] if g["started_at"] != aborted["started_at"]
                        and g["params"].get("max_tokens") not in PROBE_MAX_TOKENS)
        assert served == sorted(len(c.completion_token_ids) for c in ok), (served, gens["recent"])

        # Token-in continuation never continues from the lost call (it has no tokens): the call
        # after the retry continues from the retry.
        assert all(c.parent_call_id != killed for c in ok)
        after = [c for c in ok if c.started_at > retried[0].started_at]
        assert all(c.parent_call_id in {o.call_id for o in ok} for c in after if c.tito), \
            [(c.call_id, c.tito, c.tito_reason, c.parent_call_id) for c in ok]

        traj = p.store.get_trajectory(sid)
        assert traj.stats["lost_calls"] == 1 and traj.stats["skipped"].get("error") == 1
        [info] = traj.metadata["lost_calls"]
        assert info["call_id"] == killed and info["retried_by"] == retried[0].call_id
        assert all(killed not in t.call_ids for t in traj.traces)
        main = [t for t in traj.traces if t.metadata.get("role") == "main"]
        assert len(main) == 1 and set(main[0].call_ids) == {c.call_id for c in ok}
        assert traj.traces[info["retry_trace_index"]].metadata["retry_of_lost"] == [killed]
        print(f"\ngateway loss ({harness}): retry served {retry_at - t_kill:.1f} s after the kill (retry_count "
              f"{retried[0].retry_count}), gateway_lost record {lost_at - t_kill:.1f} s, COMPLETED "
              f"{done_at - t_kill:.1f} s; {len(ok)} ok calls, aborted stream at "
              f"{aborted['sent_tokens']}/{aborted['planned_tokens']} tokens; tito "
              f"{[(c.call_id[-6:], c.tito, c.tito_reason, (c.parent_call_id or '')[-6:]) for c in ok]}; "
              f"load {os.getloadavg()[0]:.1f}")
    finally:
        p.stop()
        stop(gw.proc)
        stop(ms.proc)
