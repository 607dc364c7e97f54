"""What the trajectory viewer shows, as JSON (pure functions: records in, dicts out).

The browser renders these; the interesting work happens here: where each call's sampled tokens
start inside a merged trace, what two prompts look like where a chain broke or forked, GRPO
advantages of a group (the trainer's own, polar_mq.rl.advantages), a session's stage timeline.

Tests: tests/api/test_ui_views.py.
"""

from __future__ import annotations

import math
import time
from typing import Any

from polar_mq import states
from polar_mq.rl.advantages import group_advantages, unusable_reason
from polar_mq.api.ui.tree import lineage_tree
from polar_mq.model import SessionRecord, Trace, Trajectory
from polar_mq.api import views

DIFF_CONTEXT = 24  # shared tokens shown before a divergence
DIFF_TAIL = 64  # tokens of each side shown after it
TEXT_PREVIEW = 2000


def policy_version(*metas: dict[str, Any] | None) -> Any:
    for meta in metas:
        if meta and meta.get("policy_version") is not None:
            return meta["policy_version"]
    return None


def timeline(rec: SessionRecord, now: float | None = None) -> list[dict[str, Any]]:
    """The states a session went through, each with its start and end (unix seconds)."""
    now = now or time.time()
    out: list[dict[str, Any]] = []
    for i, entry in enumerate(rec.history):
        state, start = entry[0], float(entry[1])
        node = entry[2] if len(entry) > 2 else None
        if i + 1 < len(rec.history):
            end = float(rec.history[i + 1][1])
        else:
            end = start if states.is_terminal(state) else now
        out.append({"state": state, "start": start, "end": end, "seconds": round(max(0.0, end - start), 3),
                    "node": node})
    return out


def task_view(task_id: str, stored: dict[str, Any], records: list[SessionRecord], cancelled: bool) -> dict[str, Any]:
    body = views.task_status(task_id, stored, records, cancelled=cancelled)
    spec = stored.get("spec") or {}
    meta = spec.get("metadata") or {}
    body["instruction"] = (spec.get("instruction") or "")[:TEXT_PREVIEW]
    body["policy_version"] = policy_version(meta)
    body["metadata"] = meta
    body["agent"] = spec.get("agent") or {}
    body["dispatch_priority"] = spec.get("dispatch_priority") or 0
    body["builder"] = spec.get("builder") or {}
    body["grader"] = {"strategy": (spec.get("grader") or {}).get("strategy")}
    by_id = {r.session_id: r for r in records}
    for s in body.get("sessions", []):
        rec = by_id[s["session_id"]]
        s["policy_version"] = policy_version(meta)
        s["timeline"] = timeline(rec)
        s["error"] = rec.error
    return body


def task_list_entry(task_id: str, stored: dict[str, Any], records: list[SessionRecord], cancelled: bool) -> dict[str, Any]:
    body = views.task_status(task_id, stored, records, cancelled=cancelled, sessions=False)
    spec = stored.get("spec") or {}
    body["instruction"] = (spec.get("instruction") or "")[:200]
    body["policy_version"] = policy_version(spec.get("metadata"))
    body["session_ids"] = [r.session_id for r in records]
    body["errors"] = sum(1 for r in records if r.state == states.ERROR)
    return body


# --- calls ----------------------------------------------------------------------------------------
def call_summary(index: int, call: dict[str, Any]) -> dict[str, Any]:
    prompt = call.get("prompt_token_ids") or []
    sampled = call.get("completion_token_ids") or []
    usage = call.get("usage") or {}
    return {
        "index": index,
        "call_id": call.get("call_id"),
        "provider": call.get("provider"),
        "stream": call.get("stream"),
        "started_at": call.get("started_at"),
        "latency_ms": call.get("latency_ms"),
        "model_requested": call.get("model_requested"),
        "model_served": call.get("model_served"),
        "tokens_in": len(prompt) or usage.get("prompt_tokens"),
        "tokens_out": len(sampled) or usage.get("completion_tokens"),
        "finish_reason": call.get("finish_reason"),
        "status": call.get("status"),
        "error": call.get("error"),
        "tito": call.get("tito"),
        "parent_call_id": call.get("parent_call_id"),
        "policy_version": call.get("policy_version"),
        "retry_count": call.get("retry_count"),
        "notes": call.get("notes") or [],
    }


def call_detail(index: int, call: dict[str, Any]) -> dict[str, Any]:
    """One call with the request as the harness sent it and as it went upstream."""
    # Rebuilt from the record as the gateway sends it (messages, tools, sampling params, and the
    # fields it always adds to get the ids and logprobs back).
    upstream: dict[str, Any] = {"model": call.get("model_served"), "messages": call.get("messages") or [],
                                **(call.get("params") or {}), "stream": bool(call.get("stream")),
                                "logprobs": True, "return_token_ids": True}
    if call.get("tools"):
        upstream["tools"] = call["tools"]
    if call.get("tito"):
        upstream["prompt_token_ids"] = f"<{len(call.get('prompt_token_ids') or [])} recorded token ids>"
    return {**call_summary(index, call), "request": call.get("request"), "upstream_request": upstream,
            "upstream_url": call.get("upstream_url"), "response_message": call.get("response_message")}


# --- traces ---------------------------------------------------------------------------------------
def _lcp(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def call_boundaries(trace: Trace, calls_by_id: dict[str, tuple[int, dict[str, Any]]]) -> list[dict[str, Any]]:
    """Where each call's sampled tokens start in the trace's sequence (prompt ids + response ids).
    A call whose record does not line up with the trace (unknown, re-tokenised) is left out."""
    full = list(trace.prompt_ids) + list(trace.response_ids)
    out = []
    for call_id in trace.call_ids:
        if call_id not in calls_by_id:
            continue
        index, call = calls_by_id[call_id]
        start = len(call.get("prompt_token_ids") or [])
        sampled = list(call.get("completion_token_ids") or [])
        if start < len(trace.prompt_ids) or start > len(full):
            continue
        lined_up = full[start:start + len(sampled)] == sampled or (  # or its end-of-turn token cut
            len(sampled) > 1 and full[start:start + len(sampled) - 1] == sampled[:-1])
        if sampled and not lined_up:
            continue
        out.append({"position": start, "call_id": call_id, "call_index": index,
                    "provider": call.get("provider"), "finish_reason": call.get("finish_reason"),
                    "tokens_out": len(sampled)})
    return out


def _sequence_of_call(call: dict[str, Any]) -> list[int]:
    return list(call.get("prompt_token_ids") or []) + list(call.get("completion_token_ids") or [])


def divergence(kind: str, ours: list[int], theirs: list[int], **where: Any) -> dict[str, Any]:
    """The two token sequences where they part: shared context, then each side's next tokens."""
    shared = _lcp(ours, theirs)
    return {"kind": kind, **where, "shared_tokens": shared,
            "context_ids": theirs[max(0, shared - DIFF_CONTEXT):shared],
            "ours_ids": ours[shared:shared + DIFF_TAIL], "theirs_ids": theirs[shared:shared + DIFF_TAIL],
            "ours_len": len(ours), "theirs_len": len(theirs)}


def trace_diff(index: int, traces: list[Trace], calls_by_id: dict[str, tuple[int, dict[str, Any]]]) -> dict[str, Any] | None:
    """A chain break or fork: this trace's prompt against the sequence it departs from."""
    trace = traces[index]
    meta = trace.metadata or {}
    ours = list(trace.prompt_ids)
    if meta.get("break") and meta.get("continues_trace") is not None:
        partner_call = meta.get("break_after_call_id")
        if partner_call in calls_by_id:
            theirs = _sequence_of_call(calls_by_id[partner_call][1])
        else:
            other = traces[int(meta["continues_trace"])]
            theirs = list(other.prompt_ids) + list(other.response_ids)
        return divergence(str(meta["break"]), ours, theirs, against_trace=meta.get("continues_trace"),
                          against_call_id=partner_call)
    if meta.get("parent_trace") is not None:
        # Against the sibling branch (the parent trace goes on past the branch point), so the
        # diff shows the two continuations, e.g. two different tool results.
        kind = meta.get("role") if meta.get("role") in ("retry", "fork") else "fork"
        parent = traces[int(meta["parent_trace"])]
        theirs = list(parent.prompt_ids) + list(parent.response_ids)
        return divergence(kind, ours, theirs, against_trace=meta.get("parent_trace"),
                          against_call_id=meta.get("same_prompt_as_call_id") or meta.get("branch_call_id"))
    return None


def trace_view(index: int, traces: list[Trace], calls_by_id: dict[str, tuple[int, dict[str, Any]]]) -> dict[str, Any]:
    trace = traces[index]
    return {"index": index, "prompt_ids": list(trace.prompt_ids), "response_ids": list(trace.response_ids),
            "loss_mask": list(trace.loss_mask), "response_logprobs": trace.response_logprobs,
            "finish_reason": trace.finish_reason, "reward": trace.reward, "call_ids": list(trace.call_ids),
            "metadata": trace.metadata or {}, "boundaries": call_boundaries(trace, calls_by_id),
            "policy_versions": list(trace.policy_versions or []),
            "diff": trace_diff(index, traces, calls_by_id)}


def token_ids(page: dict[str, Any]) -> set[int]:
    """Every id the session page shows (traces and diffs): what needs a text."""
    ids: set[int] = set()
    for tr in page.get("traces") or []:
        ids.update(tr["prompt_ids"])
        ids.update(tr["response_ids"])
        diff = tr.get("diff") or {}
        for key in ("context_ids", "ours_ids", "theirs_ids"):
            ids.update(diff.get(key) or [])
    return ids


def session_view(rec: SessionRecord, spec: dict[str, Any] | None, traj: Trajectory | None, source: str | None,
                 calls: list[dict[str, Any]], calls_error: str | None) -> dict[str, Any]:
    spec = spec or {}
    meta = spec.get("metadata") or {}
    calls_by_id = {c.get("call_id"): (i, c) for i, c in enumerate(calls)}
    traces = list(traj.traces) if traj else []
    session = {**views.session_summary(rec), "task_id": rec.task_id, "history": rec.history,
               "gateway_session_id": rec.gateway_session_id, "timeline": timeline(rec),
               "policy_version": policy_version(traj.metadata if traj else None, meta)}
    trajectory = None
    if traj is not None:
        trajectory = {"status": traj.status, "builder": traj.builder, "stats": traj.stats, "reward": traj.reward,
                      "error": traj.error, "source": source,
                      "metadata": {k: v for k, v in (traj.metadata or {}).items() if k != "grade"}}
    return {
        "session": session,
        "task": {"task_id": rec.task_id, "instruction": (spec.get("instruction") or "")[:TEXT_PREVIEW],
                 "agent": spec.get("agent") or {}, "builder": spec.get("builder") or {},
                 "grader": spec.get("grader", {}).get("strategy") if spec.get("grader") else None,
                 "metadata": meta, "num_samples": spec.get("num_samples")},
        "trajectory": trajectory,
        "grade": (traj.metadata or {}).get("grade") if traj else None,
        "traces": [trace_view(i, traces, calls_by_id) for i in range(len(traces))],
        "tree": lineage_tree(traces),
        "calls": [call_summary(i, c) for i, c in enumerate(calls)],
        "calls_error": calls_error,
    }


# --- groups ---------------------------------------------------------------------------------------
def reward_stats(rewards: list[float | None]) -> tuple[float | None, float | None]:
    """Mean and (Bessel) std of the known rewards, as the advantages use them."""
    known = [float(r) for r in rewards if r is not None]
    if not known:
        return None, None
    mean = sum(known) / len(known)
    if len(known) < 2:
        return mean, 0.0
    return mean, math.sqrt(sum((r - mean) ** 2 for r in known) / (len(known) - 1))


def _last_assistant_text(traj: Trajectory | None) -> str:
    if traj is None:
        return ""
    for trace in reversed(traj.traces):
        if (trace.metadata or {}).get("role") not in (None, "main"):
            continue
        for msg in reversed(trace.messages or []):
            if msg.get("role") == "assistant":
                content = msg.get("content")
                if isinstance(content, list):
                    content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
                text = (content or "").strip()
                calls = msg.get("tool_calls") or []
                if calls:
                    names = ", ".join(str((c.get("function") or {}).get("name")) for c in calls)
                    text = (text + f"\n[tool calls: {names}]").strip()
                if text:
                    return text[:TEXT_PREVIEW]
    return ""


def group_view(task_id: str, stored: dict[str, Any], records: list[SessionRecord],
               trajs: dict[str, Trajectory]) -> dict[str, Any]:
    spec = stored.get("spec") or {}
    rewards = [r.reward if r.reward is not None else (trajs[r.session_id].reward if r.session_id in trajs else None)
               for r in records]
    # The trainer's own advantages (polar_mq.rl.advantages): what a GRPO / RLOO step would use.
    centred = group_advantages(rewards, "mean_std", scale=False)
    normed = group_advantages(rewards, "mean_std")
    loo = group_advantages(rewards, "leave_one_out")
    mean, std = reward_stats(rewards)
    samples = []
    for rec, reward, adv, nadv, ladv in zip(records, rewards, centred, normed, loo):
        traj = trajs.get(rec.session_id)
        grade = (traj.metadata or {}).get("grade") if traj else None
        tests = (grade or {}).get("tests") or {}
        samples.append({
            "session_id": rec.session_id, "index": rec.index, "state": rec.state, "reward": reward,
            "advantage": adv, "advantage_normalised": nadv, "advantage_leave_one_out": ladv, "error": rec.error,
            "stats": traj.stats if traj else {}, "final_text": _last_assistant_text(traj),
            "tests_passed": sum(1 for s in tests.values() if str(s).upper() == "PASSED"),
            "tests_total": len(tests), "grade_status": (grade or {}).get("status"),
            "durations": views.durations(rec),
        })
    return {"task_id": task_id, "instruction": (spec.get("instruction") or "")[:TEXT_PREVIEW],
            "policy_version": policy_version(spec.get("metadata")), "mean_reward": mean, "reward_std": std,
            "unusable": unusable_reason([r.state for r in records], rewards, drop_uniform_reward=True),
            "state": views.overall_state(records), "samples": samples}
