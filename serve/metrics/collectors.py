"""Collectors that read the `Registry` when scraped, so that nothing is counted on the request path.

`ServingCollector`: queue depth, requests in flight, workers by state and their memory (RSS, PSS,
USS), the idle warm spares' and the frontend's.
`UpdateCollector`: load failures, load and warm-up times, and default-version swaps
(docs/model-updates.md).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from serve.core.host import ProcessMemory, process_memory
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
    """Queue depth, requests in flight, workers by state and worker memory, per model version;
    the memory of the idle spares and of the frontend."""

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
        pss = GaugeMetricFamily(
            "serve_worker_proportional_memory_bytes",
            "PSS of each worker process: its share of the pages it maps, shared pages split "
            "among the processes that map them (the workers' sum is what they hold together).",
            labels=[*_MODEL, "worker"],
        )
        uss = GaugeMetricFamily(
            "serve_worker_unique_memory_bytes",
            "USS of each worker process: the pages only it maps, what its exit frees.",
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
        # vLLM's vllm:prefix_cache_queries / _hits (prompt tokens), per engine since its start.
        prefix_held = GaugeMetricFamily(
            "serve_engine_prefix_cache_tokens",
            "Prompt token positions each engine's prefix cache holds for reuse.",
            labels=[*_MODEL, "worker"],
        )
        prefix_queries = CounterMetricFamily(
            "serve_engine_prefix_cache_queries",
            "Prompt tokens each engine looked up in its prefix cache.",
            labels=[*_MODEL, "worker"],
        )
        prefix_hits = CounterMetricFamily(
            "serve_engine_prefix_cache_hits",
            "Prompt tokens each engine found in its prefix cache (not prefilled again).",
            labels=[*_MODEL, "worker"],
        )
        shared = CounterMetricFamily(
            "serve_engine_shared_prompt_tokens",
            "Prompt tokens each engine did not prefill: an equal prompt admitted beside them "
            "was prefilled once for all.",
            labels=[*_MODEL, "worker"],
        )
        graph_hits = CounterMetricFamily(
            "serve_engine_cuda_graph_hits",
            "Decode steps each engine replayed from a captured CUDA graph (on a GPU).",
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
                    if "prefix_hit_tokens" in engine:
                        prefix_held.add_metric(labels, engine.get("prefix_cache_tokens", 0))
                        prefix_queries.add_metric(labels, engine.get("prefix_queried_tokens", 0))
                        prefix_hits.add_metric(labels, engine["prefix_hit_tokens"])
                    if "shared_prompt_tokens" in engine:
                        shared.add_metric(labels, engine["shared_prompt_tokens"])
                    if "cuda_graph_hits" in engine:
                        graph_hits.add_metric(labels, engine["cuda_graph_hits"])
                if info.pid is not None and state is not WorkerState.DEAD:
                    memory = process_memory(info.pid)
                    if memory is not None:
                        labels = [*key, info.worker_id]
                        rss.add_metric(labels, memory.rss)
                        if memory.pss is not None:
                            pss.add_metric(labels, memory.pss)
                        if memory.uss is not None:
                            uss.add_metric(labels, memory.uss)
            for state_name, count in counts.items():
                workers.add_metric([*key, state_name], count)
        yield from (depth, in_flight, workers, rss, pss, uss)
        yield from self._process_memory()
        if running.samples:
            yield from (running, waiting)
        if engine_running.samples:
            yield from (kv_usage, engine_running, engine_waiting)
        if prefix_hits.samples:
            yield from (prefix_held, prefix_queries, prefix_hits)
        if shared.samples:
            yield shared
        if graph_hits.samples:
            yield graph_hits

    def _process_memory(self) -> Iterator[Metric]:
        spares = [process_memory(pid) for pid in self.serving.spares.ready_pids()]
        spare = GaugeMetricFamily(
            "serve_spare_memory_bytes",
            "Memory of the idle warm spares together, by kind (rss, pss, uss).",
            labels=["kind"],
        )
        _add_kinds(spare, [m for m in spares if m is not None])
        frontend = GaugeMetricFamily(
            "serve_frontend_memory_bytes",
            "Memory of the frontend process, by kind (rss, pss, uss).",
            labels=["kind"],
        )
        own = process_memory(os.getpid())
        _add_kinds(frontend, [own] if own is not None else [])
        ready = GaugeMetricFamily("serve_spares_ready", "Warm spare interpreters ready now.")
        ready.add_metric([], len(spares))
        yield from (spare, frontend, ready)


def _add_kinds(family: GaugeMetricFamily, readings: list[ProcessMemory]) -> None:
    """The sum of each kind over ``readings``; PSS and USS only where every reading has them."""
    family.add_metric(["rss"], sum(m.rss for m in readings))
    for kind in ("pss", "uss"):
        values = [getattr(m, kind) for m in readings]
        if all(v is not None for v in values):
            family.add_metric([kind], sum(values))


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
