"""Which weights sampled which tokens of a streamed call (`CaptureRecord.policy_versions`).

With vLLM's pause mode `keep` a generation in flight is frozen by the weight sync and goes on
with the new weights after the resume. Its tokens stop arriving meanwhile, so the accumulator
notes each long gap in the token flow (vllm_wire.TOKEN_GAP); only a stream with such a gap asks
Redis which versions were set while it ran (pause_state.versions_since: the resumes' times),
and each new version starts at the first token that arrived after its resume. An ordinary call
costs nothing more and carries one pair. Guarded by tests/gateway/test_policy_versions.py.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from polar_mq.model import CaptureRecord

if TYPE_CHECKING:
    from polar_mq.store.pause import PauseState
    from polar_mq.proxy_app.upstream.vllm_wire import StreamAccumulator

log = logging.getLogger("polar_mq.gateway.versions")


def single(record: CaptureRecord) -> None:
    """One policy sampled the whole call: the version it was admitted with."""
    record.policy_versions = [[0, record.policy_version]]


def split_stream(record: CaptureRecord, acc: "StreamAccumulator", state: "PauseState | None") -> None:
    single(record)
    if not acc.gaps or state is None or record.policy_version is None:
        return
    try:
        changes = state.versions_since(record.started_at)
    except Exception as exc:  # redis down: the call keeps its admitted version, said so
        log.warning("could not read the policy version log: %s", exc)
        record.notes.append("policy version log unavailable: policy_versions has the admitted version only")
        return
    pairs: list[list[Any]] = record.policy_versions
    for version, at in changes:
        if version == pairs[-1][1]:
            continue
        offset = next((off for off, arrived in acc.gaps if arrived >= at), None)
        if offset is None or offset <= pairs[-1][0]:
            continue
        pairs.append([offset, version])
    if len(pairs) > 1:
        record.notes.append("sampled by policy versions " + ", ".join(
            f"{v} from token {off}" for off, v in pairs))
