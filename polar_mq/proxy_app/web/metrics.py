"""Live gateway metrics in Prometheus text at `GET /metrics` (prometheus_client).

What a researcher watches while a run goes: per-provider call latency, tokens per second (the
rate of the token counters, and each call's decode speed as a histogram), generations in flight,
upstream errors and retries, and how often a call continued a recorded one as token ids (TITO).

Every stored CaptureRecord passes `observe` (the Recorder calls its observers once Redis answered
the record's write: for a plain call, after its reply went out), the
upstream pool reports retries through `on_retry`, the pause gate the calls it admits and releases
(in flight). gunicorn runs
several worker processes: `prepare_multiprocess` (called before the workers fork) points
prometheus_client at a fresh directory so that a scrape of any worker sums all of them.

Updates are batched per process (`Batched`): a call adds to plain dicts, and the sums go into
prometheus_client's values every FLUSH_INTERVAL s, at every scrape of this process, and at exit.
Why: in multiprocess mode each `inc` takes a lock, checks the pid and writes the memory-mapped
file, and a call makes seven such writes (two histograms, three counters, the in-flight gauge up
and down). The cost: a scrape answered by one
worker sees another worker's calls up to FLUSH_INTERVAL s late (a scrape of the same worker, or
of a single-worker gateway, sees everything), and a call that starts and ends between two flushes
moves the in-flight gauge not at all (it is a sample).

TITO fields come from another part of the gateway and are read with getattr, so these metrics
work on records with and without them: `tito` true counts a continuation; a record that extends
a recorded call (`parent_call_id` set) but went upstream re-rendered (`tito` false) counts a break
(the token prefix of the conversation was not carried over).

Tests: tests/gateway/test_metrics_live.py.
"""

from __future__ import annotations

import atexit
import bisect
import hmac
import os
import shutil
import tempfile
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any

from flask import Flask, Response, request

from polar_mq._io.locks import short_lock
from polar_mq.model import PROVIDERS

if TYPE_CHECKING:
    from polar_mq.model import CaptureRecord
    from polar_mq.proxy_app.core import Gateway

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"  # prometheus_client's own variable
LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320, 600)
SPEED_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000)


def prepare_multiprocess(directory: str | None = None) -> str:
    """Before gunicorn forks: a fresh metrics directory shared by the worker processes (stale
    files of an earlier run would be summed in), removed when the master exits."""
    path = directory or tempfile.mkdtemp(prefix="polar-gw-metrics-")
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path, exist_ok=True)
    atexit.register(shutil.rmtree, path, True)
    os.environ[MULTIPROC_ENV] = path
    return path


FLUSH_INTERVAL = 0.25  # s: how late another worker's calls may show in a scrape


class Batched:
    """Counter, gauge and histogram updates summed in plain dicts and written to the metrics'
    values together (module docstring). A histogram's observations are kept as their sum and a
    count per bucket, exactly what `Histogram.observe` adds up, and written through the same
    values it writes (`_sum`, `_buckets`); a prometheus_client without those attributes gets its
    observations replayed through `observe` instead."""

    def __init__(self, interval: float = FLUSH_INTERVAL) -> None:
        self.interval = interval
        self._counts: dict[Any, float] = {}  # counter or gauge child -> amount
        self._hists: dict[Any, list[Any]] = {}  # histogram child -> [sum, count per bucket] or [values]
        self._lock = short_lock()
        self._flushing = False  # this process has its flusher (reset in a forked child)
        ref = weakref.ref(self)
        os.register_at_fork(after_in_child=lambda: _forked(ref))

    def inc(self, child: Any, amount: float = 1.0) -> None:
        with self._lock:
            self._counts[child] = self._counts.get(child, 0.0) + amount
        if not self._flushing:
            self._start_flusher()

    def observe(self, child: Any, value: float) -> None:
        bounds = getattr(child, "_upper_bounds", None)
        with self._lock:
            held = self._hists.get(child)
            if bounds is None or not hasattr(child, "_sum") or not hasattr(child, "_buckets"):
                if held is None:
                    held = self._hists[child] = [None]
                held.append(value)
            else:
                if held is None:
                    held = self._hists[child] = [0.0, [0] * len(bounds)]
                held[0] += value
                i = bisect.bisect_left(bounds, value)  # the first bound >= value, as observe() picks
                if i < len(bounds):
                    held[1][i] += 1
        if not self._flushing:
            self._start_flusher()

    def flush(self) -> None:
        with self._lock:
            counts, self._counts = self._counts, {}
            hists, self._hists = self._hists, {}
        for child, amount in counts.items():
            if amount:
                child.inc(amount)
        for child, held in hists.items():
            if held[0] is None:
                for value in held[1:]:
                    child.observe(value)
                continue
            child._sum.inc(held[0])
            for i, n in enumerate(held[1]):
                if n:
                    child._buckets[i].inc(n)

    def _start_flusher(self) -> None:
        """One flushing thread per process (a greenlet under gevent), started on first use: a
        gunicorn worker is forked after the app is made."""
        with self._lock:
            if self._flushing:
                return
            self._flushing = True
        threading.Thread(target=self._flush_forever, name="metrics-flush", daemon=True).start()
        atexit.register(self.flush)

    def _flush_forever(self) -> None:
        while True:
            time.sleep(self.interval)
            try:
                self.flush()
            except Exception:  # a metrics file that cannot be written must not stop the next flush
                pass


def _forked(ref: "weakref.ref[Batched]") -> None:
    batched = ref()
    if batched is not None:  # the parent's flusher thread did not come along; its sums are the parent's
        batched._lock = short_lock()
        batched._flushing = False
        batched._counts, batched._hists = {}, {}


def worker_exited(pid: int) -> None:
    """gunicorn child_exit: drop a dead worker's live gauges (its in-flight count)."""
    if os.environ.get(MULTIPROC_ENV):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(pid)


class GatewayMetrics:
    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.multiprocess = bool(os.environ.get(MULTIPROC_ENV))
        self._children: dict[tuple[Any, tuple[str, ...]], Any] = {}  # child()
        self.batched = Batched()
        # A private registry (a second app in one process must not clash in the global one). With
        # several processes the values go to files and a scrape collects the directory instead.
        self.registry = CollectorRegistry()
        reg: dict[str, Any] = {"registry": self.registry}
        self.latency = Histogram("polar_mq_gateway_call_seconds", "model call latency at the gateway",
                                 ["provider", "stream", "status"], buckets=LATENCY_BUCKETS, **reg)
        self.speed = Histogram("polar_mq_gateway_decode_tokens_per_second",
                               "sampled tokens per second of one call", ["provider"], buckets=SPEED_BUCKETS,
                               **reg)
        self.generations = Counter("polar_mq_gateway_generations", "recorded model calls",
                                   ["provider", "status"], **reg)
        self.prompt_tokens = Counter("polar_mq_gateway_prompt_tokens", "prompt tokens of recorded calls",
                                     ["provider"], **reg)
        self.completion_tokens = Counter("polar_mq_gateway_completion_tokens",
                                         "sampled tokens of recorded calls (rate() = tokens/s)",
                                         ["provider"], **reg)
        self.errors = Counter("polar_mq_gateway_upstream_errors", "calls that ended in an error, by kind",
                              ["provider", "kind"], **reg)
        self.retries = Counter("polar_mq_gateway_upstream_retries", "upstream attempts retried",
                               ["upstream", "kind"], **reg)
        self.connects = Counter("polar_mq_gateway_upstream_connections_opened",
                                "TCP connections the gateway opened to an upstream for generations (a "
                                "kept-alive one serves many calls: a rate near the call rate means none is)",
                                ["upstream"], **reg)
        self.inflight = Gauge("polar_mq_gateway_inflight_generations", "generations in flight in this gateway",
                              multiprocess_mode="livesum", **reg)
        self.tito = Counter("polar_mq_gateway_tito_continuations",
                            "calls sent upstream as token ids continuing a recorded call", ["provider"], **reg)
        self.tito_breaks = Counter("polar_mq_gateway_tito_breaks",
                                   "calls extending a recorded call that went upstream re-rendered",
                                   ["provider"], **reg)
        for provider in PROVIDERS:  # zeros from the start: a rate over a series that exists
            for counter in (self.prompt_tokens, self.completion_tokens, self.tito, self.tito_breaks):
                counter.labels(provider)
            for status in ("ok", "error"):
                self.generations.labels(provider, status)

    def child(self, metric: Any, *labels: str) -> Any:
        """`metric.labels(*labels)`, looked up once: labels() takes a lock and checks its
        arguments on every call."""
        key = (metric, labels)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = metric.labels(*labels)
        return found

    def observe(self, record: "CaptureRecord") -> None:
        provider = record.provider
        seconds = max(0.0, float(record.latency_ms or 0.0) / 1000.0)
        status = record.status or "ok"
        child, batched = self.child, self.batched
        batched.observe(child(self.latency, provider, "true" if record.stream else "false", status), seconds)
        batched.inc(child(self.generations, provider, status))
        prompt = len(record.prompt_token_ids or [])
        sampled = len(record.completion_token_ids or [])
        batched.inc(child(self.prompt_tokens, provider), prompt)
        batched.inc(child(self.completion_tokens, provider), sampled)
        if sampled and seconds > 0:
            batched.observe(child(self.speed, provider), sampled / seconds)
        if status == "error":
            kind = (record.error or "unknown").split(":", 1)[0].strip() or "unknown"
            batched.inc(child(self.errors, provider, kind))
        tito = getattr(record, "tito", None)
        if tito:
            batched.inc(child(self.tito, provider))
        elif tito is not None and getattr(record, "parent_call_id", None):
            batched.inc(child(self.tito_breaks, provider))

    def on_retry(self, upstream: str, error: Any) -> None:
        self.batched.inc(self.child(self.retries, upstream, getattr(error, "kind", "error")))

    def on_connect(self, upstream: str) -> None:
        self.batched.inc(self.child(self.connects, upstream))

    def on_inflight(self, delta: int) -> None:
        self.batched.inc(self.inflight, delta)

    def exposition(self) -> tuple[bytes, str]:
        from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest, multiprocess

        self.batched.flush()

        if not self.multiprocess:
            return generate_latest(self.registry), CONTENT_TYPE_LATEST
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        return generate_latest(registry), CONTENT_TYPE_LATEST


def install(app: Flask, gw: "Gateway") -> GatewayMetrics:
    """Hook the metrics into the gateway's recorder, upstream pool and in-flight count; serve them."""
    metrics = GatewayMetrics()
    gw.recorder.observers.append(metrics.observe)
    gw.pool.on_retry = metrics.on_retry
    lean = getattr(gw.pool, "lean", None)  # the upstream pool's HTTP/1.1 client (a test pool has none)
    if lean is not None:
        lean.on_connect = metrics.on_connect
    gw.pause.observers.append(metrics.on_inflight)
    app.extensions["polar_gateway_metrics"] = metrics

    @app.get("/metrics")
    def gateway_metrics() -> Response:
        token = gw.settings.admin_token
        auth = request.headers.get("Authorization", "")
        if token and not (auth.lower().startswith("bearer ") and hmac.compare_digest(auth[7:].strip(), token)):
            resp = Response('{"type":"about:blank","title":"Unauthorized","status":401,'
                            '"detail":"a valid bearer token is required"}', status=401,
                            content_type="application/problem+json")
            return resp
        body, content_type = metrics.exposition()
        return Response(body, status=200, content_type=content_type)

    return metrics
