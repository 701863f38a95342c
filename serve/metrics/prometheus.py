"""Prometheus metrics, all kept in the frontend; workers report their timings in each reply.

Recorded on the request path (labelled children cached per model version, so a request costs a
few dictionary lookups and increments, with no lock shared between requests):

* TorchServe's ``ts_inference_requests_total``, ``ts_inference_latency_microseconds``,
  ``ts_queue_latency_microseconds`` (labels model_name, model_version, hostname) and
  ``Requests2XX/4XX/5XX`` (every response on every port, labels Level, Hostname);
* ``serve_requests_total{model,version,status}``, and histograms per model version of
  ``serve_request_duration_seconds``, ``serve_queue_wait_seconds``, ``serve_batch_size`` and
  ``serve_handler_duration_seconds{phase}``; ``serve_worker_restarts_total``;
* handler metrics (``context.metrics.add_*``) under their own, sanitised names (`HandlerMetrics`).

Read at scrape time (collectors): queue depth, requests in flight, workers by state and their RSS
(`ServingCollector`), host and GPU gauges (`serve.metrics.system`), the frontend's own process.
The text format is written by `serve.metrics.exposition`.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    ProcessCollector,
    disable_created_metrics,
)
from prometheus_client.metrics_core import Metric

from serve.core.observer import VersionTally
from serve.metrics.collectors import ServingCollector
from serve.metrics.exposition import BareCounter, render
from serve.metrics.handler import HandlerMetrics
from serve.metrics.system import SystemMetrics

if TYPE_CHECKING:
    from serve.core.host import GpuSample
    from serve.core.jobs import BatchOutcome, Job
    from serve.core.registry import Registry

logger = logging.getLogger(__name__)

disable_created_metrics()  # the *_created series only double the exposition

_LATENCY_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
    30,
    60,
)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
_MAX_PHASES = 16  # handler_timings keys come from handler code: keep the label set bounded
# What a generative worker (serve/worker/concurrent.py) adds to a request's timings: counted in
# the LLM series below, not observed as handler phases.
_GENERATION_KEYS = frozenset({"first_token", "prompt_tokens", "completion_tokens"})


class _RequestSeries:
    """The children one model version's requests update, looked up once."""

    __slots__ = ("latency", "model", "by_status", "ts_latency", "ts_requests", "version")

    def __init__(self, metrics: ServerMetrics, model: str, version: str) -> None:
        self.model = model
        self.version = version
        self.latency = metrics.request_seconds.labels(model, version)
        self.ts_requests = metrics.torchserve.tally(_TS_REQUESTS, model, version)
        self.ts_latency = metrics.torchserve.tally(_TS_LATENCY, model, version)
        self.by_status: dict[int, Any] = {}


class _BatchSeries:
    __slots__ = ("batch_size", "metrics", "model", "phases", "queue", "ts_queue", "version")

    def __init__(self, metrics: ServerMetrics, model: str, version: str) -> None:
        self.metrics, self.model, self.version = metrics, model, version
        self.batch_size = metrics.batch_size.labels(model, version)
        self.queue = metrics.queue_seconds.labels(model, version)
        self.ts_queue = metrics.torchserve.tally(_TS_QUEUE, model, version)
        self.phases: dict[str, Any] = {}


class ServerMetrics:
    """The server's metric families and the cheap calls the request path makes."""

    def __init__(self, *, system: SystemMetrics | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.hostname = socket.gethostname()
        self.serving: Registry | None = None
        # (model, version) -> counts for Triton's statistics extension (serve/http/triton.py)
        self.tallies: dict[tuple[str, str], VersionTally] = {}
        r = self.registry
        self.torchserve = TorchServeCounters(self.hostname)
        r.register(self.torchserve)
        model = ["model", "version"]
        self.requests = Counter(
            "serve_requests", "Inference requests by status code.", [*model, "status"], registry=r
        )
        self.request_seconds = Histogram(
            "serve_request_duration_seconds",
            "End-to-end inference request latency.",
            model,
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.queue_seconds = Histogram(
            "serve_queue_wait_seconds",
            "Time from arrival to dispatch to a worker.",
            model,
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.batch_size = Histogram(
            "serve_batch_size",
            "Requests per batch sent to a worker.",
            model,
            buckets=_BATCH_BUCKETS,
            registry=r,
        )
        self.handler_seconds = Histogram(
            "serve_handler_duration_seconds",
            "Handler time per batch, by phase (handler is the whole call).",
            [*model, "phase"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        # Generative models: vLLM's ``vllm:`` families' meanings, under Lantern's ``serve_``
        # prefix (docs/generation.md), so that LLM dashboards can be pointed at them.
        self.time_to_first_token = Histogram(
            "serve_time_to_first_token_seconds",
            "Generative requests: arrival to first token (queue wait included).",
            model,
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.inter_token_latency = Histogram(
            "serve_inter_token_latency_seconds",
            "Generative requests: mean time between tokens after the first, one per request.",
            model,
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.e2e_latency = Histogram(
            "serve_e2e_request_latency_seconds",
            "Generative requests: arrival to last token (queue wait included).",
            model,
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.prompt_tokens = Counter(
            "serve_prompt_tokens", "Generative requests: prompt tokens.", model, registry=r
        )
        self.generation_tokens = Counter(
            "serve_generation_tokens", "Generative requests: tokens generated.", model, registry=r
        )
        self.restarts = Counter(
            "serve_worker_restarts", "Worker processes restarted.", model, registry=r
        )
        self.recycles = Counter(
            "serve_worker_recycles",
            "Healthy workers replaced between batches (reason: memory, over worker_max_rss_mb).",
            [*model, "reason"],
            registry=r,
        )
        # Plain ints: the event loop is the only writer, and TorchServe's names need the
        # hand-written exposition in `_status_families` (no _total suffix).
        self.status_classes = {2: 0, 4: 0, 5: 0}
        self.handler = HandlerMetrics(self.hostname)
        self.system = system if system is not None else SystemMetrics()
        r.register(self.handler)
        r.register(self.system)
        ProcessCollector(registry=r)  # the frontend's own process_* series
        self._requests: dict[tuple[str, str], _RequestSeries] = {}
        self._batches: dict[tuple[str, str], _BatchSeries] = {}

    def bind(self, serving: Registry) -> None:
        """Read queue and worker gauges from ``serving`` when scraped; resolve default versions."""
        self.serving = serving
        self.registry.register(ServingCollector(serving))

    # ----- the request path ----------------------------------------------------------------

    def request_done(self, model: str, version: str, status: int, seconds: float) -> None:
        """One inference request answered; ``version`` is the URL's, or ``"default"``."""
        key = (model, version)
        if version == "default":  # the URL named none: label with the version that served it
            version = self.default_version(model) or version
        series = self._requests.get(key)
        if series is None or series.version != version:
            series = self._requests[key] = _RequestSeries(self, model, version)
        series.latency.observe(seconds)
        tally = self.tallies.get((model, version))
        if tally is None:
            tally = self.tallies[(model, version)] = VersionTally()
        if status < 400:
            tally.success += 1
            tally.success_seconds += seconds
        else:
            tally.fail += 1
            tally.fail_seconds += seconds
        tally.last_inference = time.time()
        series.ts_requests.value += 1.0
        series.ts_latency.value += seconds * 1e6
        counter = series.by_status.get(status)
        if counter is None:
            counter = series.by_status[status] = self.requests.labels(
                series.model, series.version, str(status)
            )
        counter.inc()

    def default_version(self, model: str) -> str | None:
        """The version a request that names none is served by, if ``model`` is registered."""
        entry = self.serving.models.get(model) if self.serving is not None else None
        return entry.default_version if entry is not None else None

    def response_sent(self, status: int) -> None:
        """Any HTTP response on any port (TorchServe's Requests2XX/4XX/5XX)."""
        cls = status // 100
        if cls in self.status_classes:
            self.status_classes[cls] += 1

    def batch_done(self, model: str, version: str, jobs: list[Job], outcome: BatchOutcome) -> None:
        """A worker answered a batch: sizes, queue waits, handler phases and handler metrics."""
        series = self._batches.get((model, version))
        if series is None:
            series = self._batches[(model, version)] = _BatchSeries(self, model, version)
        series.batch_size.observe(len(jobs))
        queue, ts_queue = series.queue, series.ts_queue
        tally = self.tallies.get((model, version))
        if tally is None:
            tally = self.tallies[(model, version)] = VersionTally()
        tally.executions += 1
        tally.inferences += len(jobs)
        for job in jobs:
            wait = job.dispatched_at - job.arrived
            if wait < 0.0:
                wait = 0.0
            queue.observe(wait)
            ts_queue.value += wait * 1e6
            tally.queue_seconds += wait
        phases = series.phases
        timings = outcome.timings
        if "completion_tokens" in timings:
            self._generation_done(series, jobs, timings)
        for phase, seconds in timings.items():
            if not isinstance(seconds, (int, float)):  # handler_timings is handler-written
                continue
            if phase in _GENERATION_KEYS:
                continue
            child = phases.get(phase)
            if child is None:
                if len(phases) >= _MAX_PHASES:
                    continue
                child = phases[phase] = self.handler_seconds.labels(model, version, phase)
            child.observe(seconds)
        if outcome.metrics:
            self.handler.record(outcome.metrics)

    def _generation_done(
        self, series: _BatchSeries, jobs: list[Job], timings: dict[str, float]
    ) -> None:
        """A generative worker's request ended: its latencies and token counts."""
        labels = (series.model, series.version)
        try:
            prompt = float(timings.get("prompt_tokens", 0.0))
            generated = float(timings.get("completion_tokens", 0.0))
            total = float(timings.get("handler", 0.0))
            first = timings.get("first_token")
        except (TypeError, ValueError):
            return
        waited = max(0.0, jobs[0].dispatched_at - jobs[0].arrived) if jobs else 0.0
        self.prompt_tokens.labels(*labels).inc(max(0.0, prompt))
        self.generation_tokens.labels(*labels).inc(max(0.0, generated))
        self.e2e_latency.labels(*labels).observe(waited + total)
        if isinstance(first, (int, float)):
            self.time_to_first_token.labels(*labels).observe(waited + first)
            if generated > 1:
                self.inter_token_latency.labels(*labels).observe((total - first) / (generated - 1))

    def worker_restarted(self, model: str, version: str) -> None:
        self.restarts.labels(model, version).inc()

    def worker_recycled(self, model: str, version: str, reason: str) -> None:
        """A healthy worker replaced on purpose (``reason``: ``memory``, its RSS cap)."""
        self.recycles.labels(model, version, reason).inc()

    def model_removed(self, model: str) -> None:
        """The last version of ``model`` is gone: drop its series from every family (else
        each name ever registered keeps ~70 series on /metrics for good)."""
        for key in [k for k in self._requests if k[0] == model]:
            del self._requests[key]
        for key in [k for k in self._batches if k[0] == model]:
            del self._batches[key]
        mv = ("model", "version")
        for family, labels in (
            (self.requests, (*mv, "status")),
            (self.request_seconds, mv),
            (self.queue_seconds, mv),
            (self.batch_size, mv),
            (self.handler_seconds, (*mv, "phase")),
            (self.restarts, mv),
            (self.recycles, (*mv, "reason")),
        ):
            _remove_model_children(family, labels, model)
        self.torchserve.forget_model(model)
        self.handler.forget_model(model)

    async def gpu_samples(self) -> list[GpuSample]:
        """The latest GPU samples (`serve.core.observer.Observer`: memory admission asks)."""
        return await self.system.gpu_samples()

    def custom(self, metrics: list[dict[str, Any]]) -> None:
        """Handler metrics reported by a worker (``batch_done`` passes them on already)."""
        self.handler.record(metrics)

    # ----- scraping ------------------------------------------------------------------------

    async def refresh(self) -> None:
        """Update what cannot be read synchronously at scrape time (GPU samples)."""
        await self.system.refresh()

    def families(self, names: Iterable[str] | None = None) -> list[Metric]:
        """Every metric family, or only those named (TorchServe's ``?name[]=`` filter).

        A name matches a family by its own name or, for counters, with ``_total`` added.
        """
        families = [*self.registry.collect(), *self._status_families()]
        if names is None:
            return families
        wanted = set(names)
        return [
            f
            for f in families
            if f.name in wanted or (f.type == "counter" and f"{f.name}_total" in wanted)
        ]

    def exposition(self, names: Iterable[str] | None = None) -> bytes:
        """The Prometheus text format (0.0.4) of `families`."""
        return render(self.families(names))

    def _status_families(self) -> list[Metric]:
        families: list[Metric] = []
        for cls, count in self.status_classes.items():
            name = f"Requests{cls}XX"
            family = BareCounter(name, f"Responses with a {cls}xx status, on every port.")
            family.add_sample(name, {"Level": "Host", "Hostname": self.hostname}, count)
            families.append(family)
        return families


def _remove_model_children(
    family: Counter | Histogram, labels: tuple[str, ...], model: str
) -> None:
    """Remove every child of ``family`` (labelled ``labels``, in order) whose ``model`` label is
    ``model``, found through its samples (prometheus_client lists no children publicly)."""
    children = set()
    for metric in family.collect():
        for sample in metric.samples:
            if sample.labels.get("model") == model:
                children.add(tuple(sample.labels[n] for n in labels))
    for values in children:
        family.remove(*values)


class _Tally:
    """One counter value; only the event loop adds to it."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0


_TS_REQUESTS = "ts_inference_requests_total"
_TS_LATENCY = "ts_inference_latency_microseconds"
_TS_QUEUE = "ts_queue_latency_microseconds"


class TorchServeCounters:
    """TorchServe's per-model counters under the exact names its dashboards query.

    TorchServe sums microseconds in counters named without ``_total``; prometheus_client's
    ``Counter`` would expose ``..._microseconds_total``, so these are tallies rendered by `render`.
    """

    FAMILIES = {
        _TS_REQUESTS: "Total inference requests.",
        _TS_LATENCY: "Cumulative inference latency in microseconds.",
        _TS_QUEUE: "Cumulative queue latency in microseconds.",
    }

    def __init__(self, hostname: str) -> None:
        self.hostname = hostname
        self._tallies: dict[str, dict[tuple[str, str], _Tally]] = {f: {} for f in self.FAMILIES}

    def tally(self, family: str, model: str, version: str) -> _Tally:
        return self._tallies[family].setdefault((model, version), _Tally())

    def forget_model(self, model: str) -> None:
        for tallies in self._tallies.values():
            for key in [k for k in tallies if k[0] == model]:
                del tallies[key]

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        for name, doc in self.FAMILIES.items():
            if name == _TS_REQUESTS:  # already ends in _total, as prometheus_client writes it
                metric = Metric(name.removesuffix("_total"), doc, "counter")
            else:
                metric = BareCounter(name, doc)
            for (model, version), tally in list(self._tallies[name].items()):
                labels = {"model_name": model, "model_version": version, "hostname": self.hostname}
                metric.add_sample(name, labels, tally.value)
            yield metric
