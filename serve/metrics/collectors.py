"""Collectors that read the `Registry` when scraped, so that nothing is counted on the request path.

`ServingCollector`: queue depth, requests in flight, workers by state and their RSS.
`UpdateCollector`: load failures, load and warm-up times, and default-version swaps
(docs/model-updates.md).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from serve.core.host import process_rss
from serve.core.jobs import WorkerState

if TYPE_CHECKING:
    from serve.core.registry import Registry

_MODEL = ["model", "version"]
_WORKER_STATES = ("STARTING", "READY", "BUSY", "STOPPING", "DEAD")


class _RegistryCollector:
    """A prometheus collector over ``serving``; its families are known only when collected."""

    def __init__(self, serving: Registry) -> None:
        self.serving = serving

    def describe(self) -> list[Metric]:
        return []


class ServingCollector(_RegistryCollector):
    """Queue depth, requests in flight, workers by state and worker RSS, per model version."""

    def collect(self) -> Iterator[Metric]:
        depth = GaugeMetricFamily(
            "serve_queue_depth", "Requests waiting for a worker.", labels=_MODEL
        )
        in_flight = GaugeMetricFamily(
            "serve_requests_in_flight", "Requests queued or running.", labels=_MODEL
        )
        workers = GaugeMetricFamily(
            "serve_workers", "Worker processes by state.", labels=[*_MODEL, "state"]
        )
        rss = GaugeMetricFamily(
            "serve_worker_resident_memory_bytes",
            "Resident memory of each worker process.",
            labels=[*_MODEL, "worker"],
        )
        # Models whose workers run many requests at once (a generative engine, asyncCommunication):
        # vLLM's vllm:num_requests_running / _waiting, under Lantern's prefix.
        running = GaugeMetricFamily(
            "serve_num_requests_running",
            "Requests running on workers with slots (generative engines, asyncCommunication).",
            labels=_MODEL,
        )
        waiting = GaugeMetricFamily(
            "serve_num_requests_waiting",
            "Requests waiting for a slot on such workers.",
            labels=_MODEL,
        )
        # Per generative engine (its worker), as its worker last reported: vLLM's
        # vllm:kv_cache_usage_perc (a fraction, 0..1, despite the name) and its per-engine
        # running / waiting counts.
        kv_usage = GaugeMetricFamily(
            "serve_kv_cache_usage_perc",
            "Fraction of each engine's KV-cache budget (max_cached_tokens) reserved, 0..1.",
            labels=[*_MODEL, "worker"],
        )
        engine_running = GaugeMetricFamily(
            "serve_engine_num_requests_running",
            "Sequences each generative engine is prefilling or decoding.",
            labels=[*_MODEL, "worker"],
        )
        engine_waiting = GaugeMetricFamily(
            "serve_engine_num_requests_waiting",
            "Sequences waiting inside each generative engine for its budget.",
            labels=[*_MODEL, "worker"],
        )
        for mv in self.serving.all_versions():
            key = [mv.name, mv.version]
            depth.add_metric(key, mv.pending_requests())
            in_flight.add_metric(key, mv.in_flight)
            infos = mv.workers()
            if any(info.limits for info in infos):
                running.add_metric(key, sum(info.in_flight for info in infos))
                waiting.add_metric(key, mv.pending_requests())
            counts = dict.fromkeys(_WORKER_STATES, 0)
            for info in infos:
                state = info.state
                counts[state.value] = counts.get(state.value, 0) + 1
                if info.engine and state is not WorkerState.DEAD:
                    labels = [*key, info.worker_id]
                    engine = info.engine
                    usage = info.kv_cache_usage
                    if usage is not None:
                        kv_usage.add_metric(labels, usage)
                    active = engine.get("running", 0) + engine.get("prefilling", 0)
                    engine_running.add_metric(labels, active)
                    engine_waiting.add_metric(labels, engine.get("waiting", 0))
                if info.pid is not None and state is not WorkerState.DEAD:
                    value = process_rss(info.pid)
                    if value is not None:
                        rss.add_metric([*key, info.worker_id], value)
            for state_name, count in counts.items():
                workers.add_metric([*key, state_name], count)
        yield from (depth, in_flight, workers, rss)
        if running.samples:
            yield from (running, waiting)
        if engine_running.samples:
            yield from (kv_usage, engine_running, engine_waiting)


class UpdateCollector(_RegistryCollector):
    """Model-update metrics: load failures, load and warm-up seconds, default-version swaps."""

    def collect(self) -> Iterator[Metric]:
        failures = CounterMetricFamily(
            "serve_model_load_failures",
            "Model versions that failed to load, warm up or be admitted (never took traffic).",
            labels=_MODEL,
        )
        for (name, version), count in sorted(self.serving.failure_counts.items()):
            failures.add_metric([name, version], count)
        load = GaugeMetricFamily(
            "serve_model_load_seconds",
            "Seconds from register to every worker loaded and warm, per version.",
            labels=_MODEL,
        )
        for (name, version), seconds in sorted(self.serving.load_seconds.items()):
            load.add_metric([name, version], seconds)
        swaps = CounterMetricFamily(
            "serve_default_version_swaps", "Times the default version moved.", labels=["model"]
        )
        for name, count in sorted(self.serving.swaps.items()):
            swaps.add_metric([name], count)
        warmup = GaugeMetricFamily(
            "serve_worker_warmup_seconds",
            "Seconds each worker spent running warm-up samples before taking traffic.",
            labels=[*_MODEL, "worker"],
        )
        for mv in self.serving.all_versions():
            for info in mv.workers():
                if info.warmup_seconds is not None:
                    warmup.add_metric([mv.name, mv.version, info.worker_id], info.warmup_seconds)
        yield from (failures, load, swaps, warmup)
