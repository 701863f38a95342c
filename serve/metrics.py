"""Prometheus metrics, all kept in the frontend; workers report their timings in each reply."""

from __future__ import annotations

import socket
import time
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics

if TYPE_CHECKING:
    from serve.batching import Job
    from serve.worker.process import BatchOutcome

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


class ServerMetrics:
    """The server's metric families and the cheap calls the request path makes."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.hostname = socket.gethostname()
        labels = ["model_name", "model_version", "hostname"]
        r = self.registry
        self.ts_requests = Counter(
            "ts_inference_requests", "Total inference requests.", labels, registry=r
        )
        self.ts_latency = Counter(
            "ts_inference_latency_microseconds",
            "Cumulative inference latency in microseconds.",
            labels,
            registry=r,
        )
        self.ts_queue = Counter(
            "ts_queue_latency_microseconds",
            "Cumulative queue latency in microseconds.",
            labels,
            registry=r,
        )
        model = ["model", "version"]
        self.requests = Counter(
            "serve_requests", "Inference requests by status code.", [*model, "code"], registry=r
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
            "Handler time per batch, by phase.",
            [*model, "phase"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.restarts = Counter(
            "serve_worker_restarts", "Worker processes restarted.", model, registry=r
        )
        self.status_classes = {
            c: Counter(
                f"Requests{c}XX",
                f"Responses with a {c}xx status.",
                ["Level", "Hostname"],
                registry=r,
            ).labels("Host", self.hostname)
            for c in (2, 4, 5)
        }

    def request_done(self, model: str, version: str, status: int, seconds: float) -> None:
        self.requests.labels(model, version, str(status)).inc()
        self.request_seconds.labels(model, version).observe(seconds)
        self.ts_requests.labels(model, version, self.hostname).inc()
        self.ts_latency.labels(model, version, self.hostname).inc(seconds * 1e6)
        cls = self.status_classes.get(status // 100)
        if cls is not None:
            cls.inc()

    def batch_done(self, model: str, version: str, jobs: list[Job], outcome: BatchOutcome) -> None:
        self.batch_size.labels(model, version).observe(len(jobs))
        queue = self.queue_seconds.labels(model, version)
        ts_queue = self.ts_queue.labels(model, version, self.hostname)
        for job in jobs:
            wait = max(0.0, job.dispatched_at - job.arrived)
            queue.observe(wait)
            ts_queue.inc(wait * 1e6)
        for phase, seconds in outcome.timings.items():
            self.handler_seconds.labels(model, version, phase).observe(seconds)

    def worker_restarted(self, model: str, version: str) -> None:
        self.restarts.labels(model, version).inc()

    def custom(self, metrics: list[dict[str, Any]]) -> None:
        """Handler metrics reported by a worker (issue: observability)."""

    @staticmethod
    def now() -> float:
        return time.perf_counter()
