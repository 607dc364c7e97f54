"""The three stages as plain functions: init → READY → run → postrun.

Each stage is idempotent: it checks the session's state, takes the session's lease, and moves the
state with an atomic compare-and-set. A duplicate delivery finds the state already advanced (or a
live lease) and returns; a takeover after a dead worker finds a stale state and redoes the stage.

Tests: tests/pipeline/test_pipeline.py, tests/pipeline/test_pipeline_faults.py.
"""

from __future__ import annotations

import functools
import json
import logging
import time
from pathlib import Path
from typing import Any

from polar_mq import merge, sampling, states
from polar_mq._io.cleanup import remove_workdirs
from polar_mq.graders.base import GradeContext
from polar_mq.graders.run import run_grading, sft_options
from polar_mq.graders.sft import record as record_sft, sft_path
from polar_mq.harnesses import HarnessContext, get_harness
from polar_mq.model import RuntimeHandle, SessionRecord, Trajectory
from polar_mq.runtimes import NoIsolation, get_runtime, resolve_backend
from polar_mq.runtimes.netbridge import sandbox_urls
from polar_mq.runtimes.local import refused_prepare
from polar_mq.taskspec import TaskRequest
from polar_mq.merge.rewards import assign_rewards
from polar_mq.rl.weight_versions import stamp_versions
from polar_mq.tasks.app import early_stop
from polar_mq.tasks.worker.cancel_watch import CancelWatch
from polar_mq.tasks.app.priority import try_acquire_slot
from polar_mq.tasks.app.routing import POSTRUN_TASK, RUN_TASK
from polar_mq.tasks.app.context import StageContext
from polar_mq.tasks.app.endings import finish_early, send_callbacks, stop_early
from polar_mq.tasks.worker.fencing import FencedStore
from polar_mq.tasks.worker.janitor import pending_key
from polar_mq.tasks.worker.lease import Lease
from polar_mq.tasks.app import causes

log = logging.getLogger("polar_mq.stages")


def register_gateway(ctx: StageContext, rec: SessionRecord, task: TaskRequest, run_attempt: int) -> dict[str, Any]:
    """A gateway session for this run attempt (a fresh one per attempt, so the calls of a dead
    attempt never mix into the next); returns the session-record fields that point at it."""
    gw_sid = rec.session_id if run_attempt == 0 else f"{rec.session_id}.r{run_attempt}"
    gw = ctx.gateway.create_session(gw_sid, rec.task_id, {"session_id": rec.session_id, **task.metadata},
                                    task.agent.sampling)
    return {"gateway_session_id": gw["session_id"], "gateway_key": gw["key"], "base_urls": gw["base_urls"]}


def gateway_index(rec: SessionRecord) -> int:
    """How many gateway sessions this session has used so far: each attempt (run takeover or re-init
    on another host) records its calls under a fresh one; the old ones stay listed in
    stats["abandoned_gateway_sessions"], so a trajectory holds exactly one attempt's calls."""
    return len(rec.stats.get("abandoned_gateway_sessions", [])) + (1 if rec.gateway_session_id else 0)


class Handoff:
    """Next-stage messages are sent only after the lease is released, so the next worker never
    finds the session still held by the stage that just finished it."""

    def __init__(self, ctx: StageContext):
        self.ctx = ctx
        self.pending: list[tuple[str, str]] = []

    def __call__(self, name: str, arg: str) -> None:
        self.pending.append((name, arg))

    def flush(self) -> None:
        for name, arg in self.pending:
            self.ctx.enqueue(name, arg)
        self.pending.clear()


def stage(*accepts: str):
    """Decorate a stage body `(ctx, rec, task, lease) -> str`: load the session, skip it unless
    its state is one this stage accepts (a duplicate delivery), hold its lease for the body
    ("busy" if a live worker holds it), and send next-stage messages only after the lease is
    released so the next worker never finds the session still held."""
    def decorate(body):
        @functools.wraps(body)
        def run(ctx: StageContext, session_id: str) -> str:
            handoff = Handoff(ctx)
            try:
                lease = Lease(ctx.store, session_id, ctx.settings.lease_ttl, node=ctx.settings.node)
                # Record, state check, lease and the task's cancel flag in one round trip.
                entry = ctx.store.enter_stage(session_id, accepts, lease.token, ctx.settings.lease_ttl)
                rec = entry.rec
                if rec is None or not entry.accepted:
                    return "skipped"
                if not entry.leased:
                    return "busy"
                lease.task_cancelled = entry.cancelled
                with lease.held():
                    task = ctx.store.cached_task_request(rec.task_id)
                    if rec.attempt:  # a takeover started: the janitor may requeue it again
                        ctx.store.r.delete(pending_key(ctx.store, session_id))
                    local = StageContext(settings=ctx.settings, gateway=ctx.gateway, enqueue=handoff,
                                         store=FencedStore(ctx.store, session_id, lease.token,
                                                           on_release=lease.released),
                                         node=ctx.node)
                    try:
                        return body(local, rec, task, lease)
                    except Exception as exc:  # the janitor retries; give_up reports it
                        causes.remember(ctx.store, session_id, rec.attempt, exc)
                        raise
            finally:
                handoff.flush()
        return run
    return decorate


def runtime_of(rec: SessionRecord) -> RuntimeHandle:
    """The session's runtime handle: every state from READY on has one (init stores it first)."""
    if rec.runtime is None:
        raise RuntimeError(f"session {rec.session_id} is {rec.state} without a runtime handle")
    return rec.runtime


def session_dir(ctx: StageContext, rec: SessionRecord) -> Path:
    return Path(ctx.settings.sessions_dir) / rec.task_id / rec.session_id


# --- init ----------------------------------------------------------------------------------------
@stage(states.REGISTERED, states.INITIALIZING)
def init_session(ctx: StageContext, rec: SessionRecord, task: TaskRequest, lease: Lease) -> str:
    """Wait for a READY slot, start the runtime, prepare it, register the gateway session."""
    store, session_id = ctx.store, rec.session_id
    if lease.task_cancelled:  # read with the lease (PipelineStore.enter_stage)
        return finish_early(ctx, rec, task, states.ERROR, "cancelled")
    if f"run@{ctx.settings.node}" not in store.live_queues(max_age=1.0):
        return "busy"  # nothing on this node would run what it prepares: leave it to a host that can
    takeover = rec.state == states.INITIALIZING
    deadline = rec.deadline or time.time() + task.timeout_seconds
    moved = store.transition(session_id, states.INITIALIZING, node=ctx.node,
                             expect={states.REGISTERED, states.INITIALIZING}, deadline=deadline)
    if moved is None:
        return "skipped"
    rec = moved
    try:
        runtime = get_runtime(resolve_backend(task.runtime, rec.runtime, session_id))
    except NoIsolation as exc:  # auto fails closed: ERROR with the reason, never a silent `local`
        return finish_early(ctx, rec, task, states.ERROR, str(exc), expect={states.INITIALIZING})
    if takeover and rec.runtime and rec.runtime.is_here(ctx.node):
        runtime.stop(rec.runtime)  # a runtime on another host is that host's to clean up
    sdir = session_dir(ctx, rec)
    handle = runtime.start(task.runtime, sdir, session_id).stamped(ctx.settings.node)
    store.transition(session_id, None, runtime=handle, workdir=handle.workdir)
    for i, step in enumerate(task.runtime.prepare):
        if time.time() > deadline:
            return to_postrun(ctx, session_id, states.TIMEOUT, "budget spent during prepare")
        err = refused_prepare(handle, step, ctx.settings.allow_local_exec) or \
            _prepare_step(runtime, handle, step, sdir / "logs" / f"prepare-{i}.log", deadline - time.time(), lease)
        if err:
            return to_postrun(ctx, session_id, states.ERROR, f"prepare step {i} failed: {err}")
    gateway_fields = register_gateway(ctx, rec, task, gateway_index(rec))
    # The READY buffer bounds *prepared* sessions waiting for a run slot: preparing never waits, so
    # the init pool keeps a stock ahead of the run slots (docs/deployment.md says how to size it).
    if not _wait_ready_slot(ctx, rec, lease, task.dispatch_priority):
        return "lease lost"
    # Into the READY list and the lease dropped with the state move (one script).
    if store.transition(session_id, states.READY, expect={states.INITIALIZING}, node=ctx.node,
                        ready="in", release=True, **gateway_fields) is None:
        store.release_slot(session_id)
        return "skipped"
    ctx.enqueue(RUN_TASK, session_id)
    return "ready"


def _wait_ready_slot(ctx: StageContext, rec: SessionRecord, lease: Lease, priority: int = 0) -> bool:
    """Block (without polling) until the READY buffer has room for this prepared session and no
    higher dispatch_priority session waits for it (tasks/priority.py)."""
    store = ctx.store
    while not try_acquire_slot(store, rec.session_id, ctx.settings.ready_capacity, priority):
        if lease.lost.is_set():
            return False
        store.wait_for_slot(timeout=1.0)
    return True


def _prepare_step(runtime, handle: RuntimeHandle, step: dict[str, Any], log_path: Path, budget: float,
                  lease: Lease) -> str | None:
    if "write" in step:  # through the runtime: the work dir may be inside a container
        spec = step["write"]
        staged = log_path.parent / f".{log_path.stem}.write"
        staged.parent.mkdir(parents=True, exist_ok=True)
        staged.write_text(spec.get("content", ""))
        try:
            runtime.upload(handle, staged, spec["path"])
        finally:
            staged.unlink(missing_ok=True)
        return None
    if "upload" in step:
        spec = step["upload"]
        runtime.upload(handle, Path(spec["src"]), spec.get("dst", Path(spec["src"]).name))
        return None
    result = runtime.exec(handle, step["exec"], env={}, timeout=min(budget, step.get("timeout", budget)),
                          log_path=log_path, heartbeat=lease.renew)
    if result.timed_out:
        return "timed out"
    if result.exit_code != 0:
        return f"exit code {result.exit_code}: {result.output_tail[-500:]}"
    return None


# --- run -----------------------------------------------------------------------------------------
@stage(states.READY, states.RUNNING)
def run_session(ctx: StageContext, rec: SessionRecord, task: TaskRequest, lease: Lease) -> str:
    """Launch the harness in the runtime under the session's remaining budget."""
    store, session_id = ctx.store, rec.session_id
    if not rec.runtime_is_here(ctx.settings.node):
        return _reroute(ctx, rec, RUN_TASK)
    takeover = rec.state == states.RUNNING
    runtime = get_runtime(resolve_backend(task.runtime, rec.runtime, session_id))
    fields: dict[str, Any] = {}
    if takeover:
        # The previous run worker died: kill what it left, start a clean attempt.
        runtime.reap(runtime_of(rec))
        run_attempt = int(rec.stats.get("run_attempts", 1))
        fields = {**register_gateway(ctx, rec, task, gateway_index(rec)),
                  "stats": {**rec.stats, "run_attempts": run_attempt + 1,
                            "abandoned_gateway_sessions":
                                rec.stats.get("abandoned_gateway_sessions", []) + [rec.gateway_session_id]}}
    else:
        fields = {"stats": {**rec.stats, "run_attempts": 1}}
    moved = store.transition(session_id, states.RUNNING, expect={states.READY, states.RUNNING},
                             node=ctx.node, ready="out", **fields)  # out of READY, its slot freed
    if moved is None:
        return "skipped"
    rec = moved
    if lease.task_cancelled:  # read with the lease (PipelineStore.enter_stage)
        return to_postrun(ctx, session_id, states.ERROR, "cancelled")
    remaining = (rec.deadline or time.time()) - time.time()
    if remaining <= 0:
        return to_postrun(ctx, session_id, states.TIMEOUT, "budget spent before the harness started")
    harness = get_harness(task.agent.harness)
    sdir = session_dir(ctx, rec)
    base_urls = rec.base_urls or {}
    if getattr(runtime, "bridges_gateway", lambda _h: False)(rec.runtime):
        base_urls = sandbox_urls(base_urls)  # a gateway on another host, via the sandbox's forwarder
    launch = harness.launch(HarnessContext(
        session_id=session_id, instruction=task.instruction, model=task.agent.model,
        key=rec.gateway_key or "", base_urls=base_urls, home=Path(runtime_of(rec).home),
        workdir=Path(runtime_of(rec).workdir), options=task.agent.options,
        max_model_len=ctx.gateway.max_model_len(), sampling=task.agent.sampling))
    cancel = CancelWatch(lambda: store.is_cancelled(rec.task_id), key=(id(store), rec.task_id))

    def should_stop() -> bool:  # in-memory only: never blocks on Redis (cancel_watch.py)
        return lease.lost.is_set() or cancel.cancelled.is_set()

    def on_start(info: dict[str, Any]) -> None:
        store.transition(session_id, None, runtime=runtime_of(rec).updated(**info))

    # The runtime bridges the gateway into a sandbox without a network (see runtimes/).
    exec_handle = runtime_of(rec).updated(gateway_urls=sorted(set((rec.base_urls or {}).values())))
    with cancel:
        result = runtime.exec(exec_handle, launch.command, env=launch.env, timeout=remaining,
                              log_path=sdir / "logs" / f"harness-{rec.attempt}.log",
                              should_stop=should_stop, on_start=on_start)
    if lease.lost.is_set():
        return "lease lost"  # another worker owns the session now
    if (result.timed_out or result.stopped) and rec.gateway_session_id:
        ctx.gateway.cancel(rec.gateway_session_id)  # abort its generations upstream (no GPU wasted)
    if result.timed_out:
        outcome, error = states.TIMEOUT, f"harness stopped after {result.duration_s:.1f} s (budget)"
    elif result.stopped:
        outcome, error = states.ERROR, "cancelled"
    elif result.exit_code == 0:
        outcome, error = states.COMPLETED, None
    else:
        outcome, error = states.ERROR, (f"harness exited with {result.exit_code}: "
                                        f"{result.output_tail[-300:].strip()}")
    return to_postrun(ctx, session_id, outcome, error, exit_code=result.exit_code)


def _reroute(ctx: StageContext, rec: SessionRecord, task_name: str) -> str:
    """A message for a runtime on another node (an old shared-queue message, or one from before a
    re-init): send it to that node's queue; if the node is gone the janitor re-initialises."""
    host = rec.runtime_host
    if host and ctx.store.node_alive(host):
        ctx.enqueue(task_name, rec.session_id)
        return "rerouted"
    return "skipped"


def to_postrun(ctx: StageContext, session_id: str, outcome: str, error: str | None, **fields: Any) -> str:
    rec = ctx.store.transition(session_id, states.POST_RUN, node=ctx.node, outcome=outcome, error=error,
                               expect={states.INITIALIZING, states.READY, states.RUNNING}, release=True,
                               **fields)
    if rec is None:
        return "skipped"
    ctx.enqueue(POSTRUN_TASK, session_id)
    return outcome.lower()


# --- postrun -------------------------------------------------------------------------------------
@stage(states.POST_RUN, states.BUILDING, states.EVALUATING)
def postrun_session(ctx: StageContext, rec: SessionRecord, task: TaskRequest, lease: Lease) -> str:
    """Build the trajectory from the captured calls, grade it, tear down, store, call back."""
    store, session_id = ctx.store, rec.session_id
    here = rec.runtime_is_here(ctx.settings.node)
    if not here and ctx.store.node_alive(rec.runtime_host or ""):
        return _reroute(ctx, rec, POSTRUN_TASK)
    moved = store.transition(session_id, states.BUILDING, node=ctx.node,
                             expect={states.POST_RUN, states.BUILDING, states.EVALUATING})
    if moved is None:
        return "skipped"
    rec = moved
    outcome = rec.outcome or states.ERROR
    # A call still running when the harness stopped is recorded once it ends (aborted if the
    # session was cancelled): wait for it, bounded, so the trajectory keeps it.
    still, calls = ctx.gateway.idle_calls(rec.gateway_session_id, ctx.settings.postrun_wait) \
        if rec.gateway_session_id else (0, [])
    try:
        traj = merge.build(task.builder.strategy, calls, task.builder.config or None,
                           session_id=session_id, task_id=rec.task_id, status=outcome)
    except Exception as exc:  # a bad builder config must not lose the session
        log.exception("builder failed for %s", session_id)
        traj = Trajectory(session_id=session_id, task_id=rec.task_id, status=states.ERROR,
                          builder=task.builder.strategy, stats={"calls": len(calls)})
        outcome, rec.error = states.ERROR, f"builder {task.builder.strategy!r} failed: {exc}"
    traj.error = rec.error
    traj.stats["calls_in_flight_at_build"] = still
    traj.metadata["sampling"] = sampling.summary(calls, task.agent.sampling)
    traj.metadata.update({**task.metadata, "harness": task.agent.harness, "model": task.agent.model,
                          "attempt": rec.attempt, "node": rec.node,
                          "gateway_session_id": rec.gateway_session_id})
    store.transition(session_id, states.EVALUATING, node=ctx.node)
    # The grader runs before teardown (it may use the session's runtime) under its own budget
    # (grader.config.timeout_seconds); it never raises: errors come back as Grade.status "error".
    grade = run_grading(task.grader.strategy, task.grader.config, traj,
                        GradeContext.for_session(rec, task, session_dir(ctx, rec), gateway=ctx.gateway))
    traj.reward = grade.reward
    traj.metadata["grade"] = grade.to_dict()
    if grade.status == "error":  # infrastructure, not the agent: trainers mask it
        outcome = states.ERROR
        traj.error = traj.error or f"grader error: {grade.details.get('error', grade.details)}"
    sft = sft_options(task.grader.config)
    if sft is not None:  # offline SFT: keep only passing trajectories (graders/sft.py)
        try:
            traj.metadata["sft"] = record_sft(sft_path(ctx.settings.results_dir, rec.task_id, sft), traj, grade,
                                              threshold=float(sft.get("pass_threshold", 1.0)),
                                              roles=sft.get("sft_roles"))
        except Exception:
            log.exception("offline SFT recording failed for %s", session_id)
    assign_rewards(traj)  # the builder's reward_scope (merge/rewards.py)
    stamp_versions(traj, calls, task.metadata)  # policy_version on trajectory and traces
    traj.status = outcome
    early_stop.label(store, traj, traj.error)  # cancelled by early stop: kept, labelled
    timings = dict(rec.timings)
    traj.metadata["timings"] = timings
    store.save_trajectory(traj)
    _write_result_file(ctx, traj)
    if rec.runtime and here:  # a runtime whose host is gone went with it
        try:
            get_runtime(resolve_backend(task.runtime, rec.runtime, session_id)).stop(rec.runtime)
        except Exception:
            log.exception("teardown failed for %s", session_id)
    if not (ctx.settings.keep_workdirs or task.runtime.keep_workdir):
        remove_workdirs(session_dir(ctx, rec))
    moved = store.transition(session_id, outcome, node=ctx.node, reward=traj.reward, release=True,
                             error=traj.error, stats={**rec.stats, **traj.stats})
    if moved is None:
        return "skipped"
    rec = moved
    stop_early(ctx, task, rec)  # enough usable sessions: stop the task's others
    send_callbacks(ctx, task, rec, traj)
    return outcome.lower()


def _write_result_file(ctx: StageContext, traj: Trajectory) -> None:
    out = Path(ctx.settings.results_dir) / (traj.task_id or "none")
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / f".{traj.session_id}.json.tmp"
    tmp.write_text(json.dumps(traj.to_dict()))
    tmp.replace(out / f"{traj.session_id}.json")


