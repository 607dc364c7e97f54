"""Runtimes left on a host that was cut off, torn down by that host when its link returns.

When a host is unreachable for 2 lease TTLs its sessions are re-initialised elsewhere
(recovery.reinitialise). Its harnesses stopped themselves (the lease self-fence), but what the
runtime holds — a container, a sandbox's work dir and HOME — is still on that host, and only that
host may touch it (model.RuntimeHandle.host). So the re-init files the old handle in a per-node list,
and every pool on the node, at each liveness beat (i.e. as soon as it reaches Redis again), takes
its node's entries and tears them down: `runtime.stop(handle)` (containers) and the work dirs (logs stay, as
after a postrun). A session that came back to this node meanwhile is left alone (its new attempt
uses the same path).
"""

from __future__ import annotations

import logging
from pathlib import Path

from polar_mq.store import replies
from polar_mq._io.cleanup import remove_workdirs
from polar_mq.model import RuntimeHandle
from polar_mq.store.pipeline import PipelineStore
from polar_mq.runtimes import get_runtime
from polar_mq.store.core import pack, unpack

log = logging.getLogger("polar_mq.leftovers")

# Runtimes that are a process group: it died with the self-fence (and PR_SET_PDEATHSIG); its pgid
# may name another process by now, so it is never signalled again — only the directories go.
BY_PROCESS_GROUP = {"local", "bwrap"}


def leftovers_key(store: PipelineStore, node: str) -> str:
    return f"{store.keys.prefix}:leftovers:{node}"


def file_leftover(store: PipelineStore, session_id: str, handle: RuntimeHandle | None) -> None:
    """Note a runtime its host must tear down when it is back (no-op for an unstamped handle)."""
    if handle is not None and handle.host and handle.backend:
        store.r.rpush(leftovers_key(store, handle.host),
                      pack({"session_id": session_id, "handle": handle.to_dict()}))


def tear_down_leftovers(store: PipelineStore, node: str, limit: int = 64) -> list[str]:
    """Tear down this node's filed leftovers (up to `limit` per call); returns their session ids."""
    done = []
    for _ in range(limit):
        blob = replies.blob(store.r.lpop(leftovers_key(store, node)))
        if blob is None:
            break
        entry = unpack(blob)
        sid, handle = entry["session_id"], RuntimeHandle.from_dict(entry["handle"])
        if not handle.is_here(node):
            continue
        current = store.get_session(sid)
        if current is not None and current.runtime_host == node:
            continue  # the session came back here: its new attempt uses the same directory
        try:
            if handle.backend not in BY_PROCESS_GROUP:
                get_runtime(handle.backend).stop(handle)
            if handle.session_dir:
                remove_workdirs(Path(handle.session_dir))
        except Exception:
            log.exception("tearing down the leftover runtime of %s failed", sid)
            continue
        log.warning("tore down the runtime %s left here by a partition (session re-initialised elsewhere)", sid)
        store.incr("leftover_runtimes_torn_down")
        done.append(sid)
    return done
