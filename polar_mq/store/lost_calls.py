"""Calls whose gateway process died while they were in flight: ended as `gateway_lost` records.

Each in-flight entry (`Keys.session_inflight`: call id -> `<admitted at>|<gateway id>|<provider>`,
written by the admission script, proxy_app/admission.py) names the gateway process that holds
the call, and every gateway process keeps `Keys.gateway_alive(id)` alive with a short TTL
(store/pause.py `PauseState.heartbeat`, every second). A process killed mid-call (kill -9, OOM, a
host gone) stops renewing it, its entries would stay forever, and postrun, which waits for a
session's in-flight count to reach 0, would wait out its whole bound for calls that will never
be recorded.

Whoever counts a session's calls in flight (`GatewayStore.inflight_calls` /
`inflight_and_calls`: postrun's wait, the gateway's `GET /sessions/<id>`) reaps them first:
`find` (one script) lists the entries whose gateway's alive key is gone; for each, one
compare-and-set script (`_CLAIM`) checks the entry is still the one seen and its gateway still
silent, then removes it and appends the call's error record in the same atomic step. Two reapers
racing, or a reaper racing a gateway that (being alive after all) stores the real record,
leave exactly one `gateway_lost` record or none (tests/store/test_lost_calls.py); if a gateway
that was only silent later stores its real record too, trajectory builders keep the ok record
of a call id over its error record (merge/records.py `prepare`).

What the record carries: the session, the call id, when it was admitted, the provider API and
the gateway that held it. Not the request: the admission entry is written before the body is
read (one round trip per call, docs/gateway_scale.md), and a killed process spools nothing.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from polar_mq.model import GATEWAY_LOST, CaptureRecord
from polar_mq.store import codec as record_codec
from polar_mq.store import replies
from polar_mq.store.replicated import run_script

log = logging.getLogger("polar_mq.store.lost_calls")

# KEYS: session in-flight hash. ARGV: alive-key prefix.
# → flat {call id, entry, ...} of entries whose gateway's alive key is gone (entries without a
#   gateway id, written before gateways named themselves, are never judged).
_FIND = """
local out = {}
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  local gid = string.match(all[i + 1], '^[^|]*|([^|]+)')
  if gid and redis.call('EXISTS', ARGV[1] .. gid) == 0 then
    out[#out + 1] = all[i]
    out[#out + 1] = all[i + 1]
  end
end
return out
"""

# KEYS: in-flight hash, the gateway's alive key, chunks hash, calls list.
# ARGV: call id, the entry as seen, the record's envelope, then digest, chunk, digest, chunk...
# → 1 when this caller ended the call (entry removed, record appended), else 0.
_CLAIM = """
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then return 0 end
if redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
redis.call('HDEL', KEYS[1], ARGV[1])
for i = 4, #ARGV, 2 do redis.call('HSETNX', KEYS[3], ARGV[i], ARGV[i + 1]) end
redis.call('RPUSH', KEYS[4], ARGV[3])
return 1
"""


@dataclass(frozen=True)
class Entry:
    """One in-flight entry as admission wrote it."""

    admitted_at: float
    gateway_id: str | None
    provider: str | None

    @classmethod
    def parse(cls, raw: bytes | str) -> "Entry":
        text = raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)
        parts = text.split("|")
        try:
            at = float(parts[0])
        except ValueError:
            at = 0.0
        gid = parts[1] if len(parts) > 1 and parts[1] else None
        provider = parts[2] if len(parts) > 2 and parts[2] else None
        return cls(at, gid, provider)


def entry_value(admitted_at: float, gateway_id: str, provider: str | None = None) -> str:
    """What admission stores for a call in flight (parsed back by `Entry.parse`)."""
    return f"{admitted_at!r}|{gateway_id}|{provider or ''}"


def lost_record(session_id: str, call_id: str, entry: Entry) -> CaptureRecord:
    """The error record of a call its gateway process took with it."""
    gid = entry.gateway_id or "?"
    return CaptureRecord(
        session_id=session_id, provider=entry.provider or "unknown", call_id=call_id,
        started_at=entry.admitted_at, status="error",
        error=f"{GATEWAY_LOST}: gateway process {gid} stopped heart-beating while this call was in "
              "flight (killed or its host lost); its client saw the connection drop and may have retried",
        notes=[f"{GATEWAY_LOST}: ended by a reaper, not by the gateway; nothing it sampled was recorded"])


class LostCalls:
    """The reaper of one Redis (a GatewayStore's client and keys)."""

    def __init__(self, client: Any, keys: Any):
        self.r, self.keys = client, keys
        self._find = client.register_script(_FIND)
        self._claim = client.register_script(_CLAIM)

    def find(self, session_id: str) -> list[tuple[str, Entry, bytes]]:
        """(call id, entry, the entry as stored) of the session's calls in flight on gateways
        that stopped beating."""
        flat = self._find(keys=[self.keys.session_inflight(session_id)], args=[self.keys.gateway_alive("")])
        out = []
        for i in range(0, len(flat) - 1, 2):
            raw = replies.blob(flat[i + 1]) or b""
            out.append((replies.text(flat[i]) or "", Entry.parse(raw), raw))
        return out

    def reap(self, session_id: str) -> list[CaptureRecord]:
        """End every call of the session whose gateway is gone: its entry out of flight, its
        `gateway_lost` record in, atomically and at most once per call. Returns the records this
        caller wrote."""
        written = []
        for call_id, entry, raw in self.find(session_id):
            assert entry.gateway_id is not None  # find only judges entries that name a gateway
            record = lost_record(session_id, call_id, entry)
            blob, chunks, _ = record_codec.encode(record)
            args: list[Any] = [call_id, raw, blob]
            for digest, stored in chunks.items():
                args += [digest, stored]
            keys = [self.keys.session_inflight(session_id), self.keys.gateway_alive(entry.gateway_id),
                    self.keys.call_chunks(session_id), self.keys.calls(session_id)]
            if run_script(self.r, self._claim, keys, args, f"gateway_lost record of call {call_id}"):
                log.warning("call %s of session %s: gateway %s is gone; recorded as %s",
                            call_id, session_id, entry.gateway_id, GATEWAY_LOST)
                written.append(record)
        return written
