"""Model-update metrics, read from the registry when scraped: load failures, load and warm-up
times, and default-version swaps (docs/model-updates.md)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

if TYPE_CHECKING:
    from serve.core.registry import Registry


class UpdateCollector:
    """A prometheus collector over `Registry` state; nothing on the request path."""

    def __init__(self, serving: Registry) -> None:
        self.serving = serving

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        model = ["model", "version"]
        failures = CounterMetricFamily(
            "serve_model_load_failures",
            "Model versions that failed to load, warm up or be admitted (never took traffic).",
            labels=model,
        )
        for (name, version), count in sorted(self.serving.failure_counts.items()):
            failures.add_metric([name, version], count)
        load = GaugeMetricFamily(
            "serve_model_load_seconds",
            "Seconds from register to every worker loaded and warm, per version.",
            labels=model,
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
            labels=[*model, "worker"],
        )
        for mv in self.serving.all_versions():
            for info in mv.workers():
                if info.warmup_seconds is not None:
                    warmup.add_metric([mv.name, mv.version, info.worker_id], info.warmup_seconds)
        yield from (failures, load, swaps, warmup)
