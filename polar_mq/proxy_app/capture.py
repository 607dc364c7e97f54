"""Capture records: build one per model call and store it, never losing it silently.

When Redis is down the record is spooled to a local msgpack file and the client gets a 503;
`replay_spool` pushes spooled records back into Redis once it is reachable again.

Tests: tests/gateway/test_deferred_store.py, tests/store/test_storage.py.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from typing import Any, Callable

import msgpack

from polar_mq._io import jsonsafe
from polar_mq.model import CaptureRecord, new_id
from polar_mq._io.token_ids import as_ids
from polar_mq.store.core import GatewayStore, StoreUnavailable, pack
from polar_mq.proxy_app.adapters.base import ChatRequest, ChatResult, GatewayError

log = logging.getLogger("polar_mq.capture")


def new_record(session_id: str, provider: str, req: ChatRequest, body: dict[str, Any],
               served_model: str | None, retry_count: int = 0,
               requested_params: dict[str, Any] | None = None, call_id: str | None = None) -> CaptureRecord:
    """`req.params` are the parameters sent upstream; `requested_params` what the harness asked
    for when a sampling policy replaced some of them (default: the same). `call_id`: one chosen
    before the record (an admission sent early: core.Gateway.admit_early); default a new one."""
    return CaptureRecord(
        session_id=session_id, provider=provider, stream=req.stream, model_requested=req.model,
        model_served=served_model, request=body, messages=req.messages, tools=req.tools,
        params=dict(req.params), notes=list(req.notes), retry_count=retry_count,
        requested_params=dict(req.params if requested_params is None else requested_params),
        call_id=call_id or new_id("call"),
    )


def fill_result(record: CaptureRecord, result: ChatResult, upstream_url: str) -> None:
    record.response_message = result.message
    record.prompt_token_ids = as_ids(result.prompt_token_ids or [])  # a TokenIds stays text
    record.completion_token_ids = list(result.completion_token_ids or [])
    record.completion_logprobs = list(result.logprobs or [])
    record.finish_reason = result.finish_reason
    record.model_served = result.model or record.model_served
    record.upstream_url = upstream_url
    record.usage = {"prompt_tokens": result.prompt_tokens, "completion_tokens": result.completion_tokens}
    record.policy_versions = [[0, record.policy_version]]  # a stream's split: versions.split_stream
    record.notes.extend(n for n in result.notes if n not in record.notes)
    if result.prompt_token_ids is None or result.completion_token_ids is None:
        record.notes.append("upstream returned no token ids")
    elif result.logprobs is not None and len(result.logprobs) != len(record.completion_token_ids):
        record.notes.append(f"logprobs misaligned: {len(result.logprobs)} logprobs for "
                            f"{len(record.completion_token_ids)} sampled ids")


ABORTED = "abort"  # finish_reason of a generation we stopped (vLLM's word for it too)


def fill_partial(record: CaptureRecord, result: ChatResult, upstream_url: str,
                 aborted: bool = False) -> None:
    """What a stream sampled before it stopped: the record keeps it (status stays error).
    `aborted`: the gateway stopped it (budget timeout, cancel, client gone), not the upstream;
    such a record gets finish_reason "abort" and enters trajectories with its partial answer."""
    record.response_message = result.message
    record.prompt_token_ids = as_ids(result.prompt_token_ids or [])  # a TokenIds stays text
    record.completion_token_ids = list(result.completion_token_ids or [])
    record.completion_logprobs = list(result.logprobs or [])
    record.finish_reason = ABORTED if aborted else None
    record.model_served = result.model or record.model_served
    record.upstream_url = upstream_url
    record.usage = {"prompt_tokens": len(record.prompt_token_ids),
                    "completion_tokens": len(record.completion_token_ids)}
    record.policy_versions = [[0, record.policy_version]]
    what = "aborted by the gateway" if aborted else "stream broke"
    record.notes.append(f"{what} after {len(record.completion_token_ids)} sampled tokens; "
                        "the record keeps what was sampled")


def fill_error(record: CaptureRecord, err: GatewayError) -> None:
    record.status = "error"
    record.error = f"{err.kind}: {err.message}"


class Recorder:
    """Appends records to Redis; spools them to disk when Redis is unavailable."""

    def __init__(self, store: GatewayStore, spool_dir: str):
        self.store = store
        self.spool_dir = Path(spool_dir)
        self._lock = threading.Lock()
        self.observers: list[Callable[[CaptureRecord], None]] = []  # live metrics (metrics.py)

    def save(self, record: CaptureRecord) -> None:
        """Store the record; on Redis failure spool it and raise GatewayError(store_unavailable).
        A record that cannot be encoded as it is (a value the edge checks let through) is stored
        sanitized (jsonsafe.sanitize, noted in the record) and the caller gets an error: it never
        vanishes and never leaves a client waiting."""
        _, error = self.write(record)
        if error is not None:
            raise error

    def write(self, record: CaptureRecord, also: Callable[[Any], None] | None = None
              ) -> tuple[bool, GatewayError | None]:
        """`save` without raising: (whether a copy reached Redis, the error for the client).
        `also` queues more commands on the record's own MULTI (the call leaving flight,
        admission.py); they ran exactly when a copy reached Redis."""
        return self.send(record, also).finish()

    def send(self, record: CaptureRecord, also: Callable[[Any], None] | None = None) -> "PendingRecord":
        """`write` up to the record's MULTI being sent to Redis: `finish()` on the result reads
        Redis's answer (spooling the record if there is none) and gives `write`'s pair. An
        encoding problem or a Redis that cannot be reached is dealt with here, as by `write`.
        The observers (live metrics) see the record in `finish()`: for a deferred write, after the
        client's reply went out."""
        try:
            return PendingRecord(self, record, self.store.send_call(record, also))
        except StoreUnavailable as exc:
            return PendingRecord(self, record, None, self._unavailable(record, exc))
        except (TypeError, ValueError, OverflowError) as exc:  # msgpack could not encode it
            log.error("call %s of session %s could not be encoded (%s: %s); storing a sanitized copy",
                      record.call_id, record.session_id, type(exc).__name__, exc)
            clean = CaptureRecord.from_dict(jsonsafe.sanitize(record.to_dict()))
            clean.notes.append(f"sanitized before storing: {type(exc).__name__}: {exc}")
            clean.status, clean.error = "error", clean.error or f"record could not be stored as sent: {exc}"
            stored = True
            try:
                self.store.append_call(clean, also)
            except StoreUnavailable:
                self._spool(clean)
                stored = False
            return PendingRecord(self, clean, None, (stored, GatewayError(
                "invalid_request", f"the call could not be recorded as sent ({exc}); a sanitized copy was kept")),
                observed=record)

    def observe(self, record: CaptureRecord) -> None:
        for observe in self.observers:
            try:
                observe(record)
            except Exception:  # metrics must never cost a record
                log.exception("record observer failed")

    def _unavailable(self, record: CaptureRecord, exc: Exception) -> tuple[bool, GatewayError]:
        self._spool(record)
        return False, GatewayError("store_unavailable",
                                   f"the gateway could not store the call ({exc}); it was kept in the "
                                   f"gateway's spool and will be replayed. Retry the request.")

    def _spool(self, record: CaptureRecord) -> None:
        self.spool_dir.mkdir(parents=True, exist_ok=True)
        with self._lock, open(self.spool_dir / f"{record.session_id}.msgpack", "ab") as fh:
            fh.write(pack(record.to_dict()))
            fh.flush()
            os.fsync(fh.fileno())
        log.error("redis unavailable: spooled call %s of session %s to %s", record.call_id,
                  record.session_id, self.spool_dir)

    def replay_spool(self) -> int:
        """Push spooled records into Redis; returns how many were replayed."""
        if not self.spool_dir.is_dir():
            return 0
        total = 0
        for path in sorted(self.spool_dir.glob("*.msgpack")):
            with self._lock:
                with open(path, "rb") as fh:
                    records = [CaptureRecord.from_dict(d) for d in msgpack.Unpacker(fh, raw=False)]
                try:
                    total += self.store.append_calls(records)
                except StoreUnavailable:
                    return total
                path.unlink()
        if total:
            log.warning("replayed %d spooled calls into redis", total)
        return total


class PendingRecord:
    """A record whose MULTI was sent (Recorder.send), or whose outcome is already known (it was
    spooled or sanitized on the way). `finish()` gives Recorder.write's (stored, error) pair,
    once; a record whose answer cannot be read is spooled then (the MULTI may still have run:
    replaying the spool then stores it twice, as when a synchronous write lost its answer)."""

    def __init__(self, recorder: Recorder, record: CaptureRecord, write: Any,
                 outcome: tuple[bool, GatewayError | None] | None = None,
                 observed: CaptureRecord | None = None):
        self.recorder, self.record, self._write, self._outcome = recorder, record, write, outcome
        self._observed: CaptureRecord | None = observed or record  # what the observers see, once

    @property
    def waiting(self) -> bool:
        """Whether Redis's answer is still to be read (else `finish()` returns at once)."""
        return self._outcome is None and self._write.in_flight

    def finish(self) -> tuple[bool, GatewayError | None]:
        if self._outcome is None:
            write, self._write = self._write, None
            try:
                write.finish()
                self._outcome = (True, None)
            except StoreUnavailable as exc:
                self._outcome = self.recorder._unavailable(self.record, exc)
        observed, self._observed = self._observed, None
        if observed is not None:
            self.recorder.observe(observed)
        return self._outcome
