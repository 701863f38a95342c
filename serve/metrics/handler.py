"""Metrics that handlers add with ``context.metrics``, kept in the frontend for Prometheus.

Exposed as TorchServe 0.12's frontend exposes them (its Prometheus simpleclient 0.9): a counter
under the handler's own name with no ``_total`` added, a gauge with its last value, a histogram
with simpleclient's default buckets. ``metrics.yaml`` declarations and the auto-detect and mode
switches come in a `MetricsPolicy` (``serve.metrics.config``).
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Iterator, Sequence
from typing import Any

from prometheus_client.metrics_core import Metric

from serve.metrics.config import MetricsPolicy
from serve.metrics.exposition import BareCounter

logger = logging.getLogger(__name__)
metrics_log = logging.getLogger("serve.worker.metrics")  # the model log, as TorchServe's log mode

# Prometheus simpleclient's default histogram buckets (what TorchServe's frontend uses).
HISTOGRAM_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10)

_INVALID_NAME = re.compile(r"[^a-zA-Z0-9_]")
_RESERVED_PREFIXES = ("serve_", "process_", "python_")
_RESERVED_NAMES = {
    "Requests2XX",
    "Requests4XX",
    "Requests5XX",
    "ts_inference_requests",
    "ts_inference_latency_microseconds",
    "ts_queue_latency_microseconds",
}


def sanitize_name(raw: str) -> str:
    """A valid Prometheus metric or label name: other characters become ``_``."""
    name = _INVALID_NAME.sub("_", raw)
    if not name or name[0].isdigit():
        name = "_" + name
    return name


# The dimensions that name the model in handler metrics (TorchServe's default is ModelName).
MODEL_LABELS = ("ModelName", "model_name")


class _Family:
    __slots__ = ("kind", "name", "series", "unit", "warned")

    def __init__(self, name: str, kind: str, unit: str) -> None:
        self.name = name
        self.kind = kind
        self.unit = unit
        self.series: dict[tuple[tuple[str, str], ...], list[Any]] = {}  # key → [labels, value]
        self.warned = False


class HandlerMetrics:
    """Metrics handlers add with ``context.metrics``, exposed with their dimensions as labels.

    Counters add up; gauges keep the last value; histograms count observations into buckets. A
    metric declared in ``metrics.yaml`` has its declared type; an undeclared one is kept only
    when the policy auto-detects. Names and label names are sanitised; names that would shadow
    the server's own families get a ``handler_`` prefix. Cardinality is bounded: at most
    ``max_metrics`` names and ``max_series`` label sets per name, label values cut to
    ``max_value_length``. In ``log``/``legacy`` mode records go to the model log instead.
    """

    def __init__(
        self,
        hostname: str,
        *,
        max_metrics: int = 256,
        max_series: int = 1000,
        max_value_length: int = 200,
        policy: MetricsPolicy | None = None,
    ) -> None:
        self.hostname = hostname
        self.policy = policy if policy is not None else MetricsPolicy()
        self._undeclared_warned: set[str] = set()
        self.max_metrics = max_metrics
        self.max_series = max_series
        self.max_value_length = max_value_length
        self._by_raw: dict[str, _Family | None] = {}  # None: refused, already logged
        self._by_key: dict[str, _Family] = {}  # by exposed name
        self._type_warned: set[str] = set()

    def describe(self) -> list[Metric]:
        return []

    def record(self, records: Sequence[dict[str, Any]]) -> None:
        """Apply records of ``{"name", "unit", "type", "value", "dimensions"}``."""
        for rec in records:
            try:
                raw = rec["name"]
                value = float(rec["value"])
                kind: str = rec["type"] if rec.get("type") in ("counter", "histogram") else "gauge"
                dims = rec.get("dimensions") or {}
                key = tuple(dims.items())
                hash(key)  # dimension values arrive from JSON: refuse lists and dicts
            except (KeyError, TypeError, ValueError, AttributeError):
                continue
            if not isinstance(raw, str):
                continue
            declared = self.policy.model_metrics.get(raw)
            if declared is not None:
                kind = declared.kind
            elif not self.policy.auto_detect:
                if raw not in self._undeclared_warned and len(self._undeclared_warned) < 1000:
                    self._undeclared_warned.add(raw)
                    logger.info(
                        "Handler metric %s is not in metrics_config and "
                        "model_metrics_auto_detect is off; not recorded",
                        raw,
                    )
                continue
            if not self.policy.exposed:
                _log_record(raw, rec, value, dims, self.hostname)
                continue
            if raw in self._by_raw:
                family = self._by_raw[raw]
            else:
                family = self._add_family(raw, kind, str(rec.get("unit") or ""))
            if family is None:
                continue
            if family.kind != kind:
                if raw not in self._type_warned:
                    self._type_warned.add(raw)
                    logger.warning(
                        "Handler metric %s was a %s and is now sent as a %s; ignoring those",
                        raw,
                        family.kind,
                        kind,
                    )
                continue
            series = family.series.get(key)
            if series is None:
                series = self._add_series(family, key)
                if series is None:
                    continue
            if kind == "counter":
                if value >= 0:
                    series[1] += value
            elif kind == "histogram":
                _observe(series, value)
            else:
                series[1] = value

    def _add_family(self, raw: str, kind: str, unit: str) -> _Family | None:
        if len(self._by_key) >= self.max_metrics:
            if len(self._by_raw) < 4 * self.max_metrics:
                self._by_raw[raw] = None
            logger.warning(
                "Handler metric %r dropped: more than %d handler metrics", raw, self.max_metrics
            )
            return None
        name = sanitize_name(raw)
        if name.startswith(_RESERVED_PREFIXES) or name.removesuffix("_total") in _RESERVED_NAMES:
            name = "handler_" + name
        family = self._by_key.get(name)
        if family is None:
            family = self._by_key[name] = _Family(name, kind, unit)
        self._by_raw[raw] = family
        return family

    def _add_series(self, family: _Family, key: tuple[tuple[Any, Any], ...]) -> list[Any] | None:
        if len(family.series) >= self.max_series:
            if not family.warned:
                family.warned = True
                logger.warning(
                    "Handler metric %s has more than %d label sets; dropping new ones",
                    family.name,
                    self.max_series,
                )
            return None
        labels: dict[str, str] = {}
        for dim, value in key:
            label = sanitize_name(str(dim).lstrip("_"))  # a leading __ is reserved
            if label in labels:
                logger.warning("Handler metric %s: duplicate label %s", family.name, label)
                return None
            labels[label] = str(value)[: self.max_value_length]
        labels.setdefault("Hostname", self.hostname)
        series = family.series[key] = [labels, 0.0]
        if family.kind == "histogram":
            series.extend([[0] * len(HISTOGRAM_BUCKETS), 0])  # per-bucket counts, total count
        return series

    def forget_model(self, model: str) -> None:
        """Drop the series a handler labelled with ``model`` (TorchServe's ``ModelName``
        dimension, or ``model_name``): the model is gone."""
        for family in self._by_key.values():
            gone = [
                key
                for key, series in family.series.items()
                if any(series[0].get(label) == model for label in MODEL_LABELS)
            ]
            for key in gone:
                del family.series[key]

    def collect(self) -> Iterator[Metric]:
        for family in list(self._by_key.values()):
            doc = f"Torchserve prometheus {family.kind} metric with unit: {family.unit or 'unit'}"
            if family.kind == "counter":  # TorchServe's name as it is: no _total added
                metric: Metric = BareCounter(family.name, doc)
            else:
                metric = Metric(family.name, doc, family.kind)
            for series in list(family.series.values()):
                labels, value = series[0], series[1]
                if family.kind == "histogram":
                    _add_histogram_samples(metric, family.name, labels, series)
                else:
                    metric.add_sample(family.name, labels, value)
            yield metric


def _observe(series: list[Any], value: float) -> None:
    series[1] += value
    series[3] += 1
    counts = series[2]
    for i, bound in enumerate(HISTOGRAM_BUCKETS):
        if value <= bound:
            counts[i] += 1


def _add_histogram_samples(
    metric: Metric, name: str, labels: dict[str, str], series: list[Any]
) -> None:
    for bound, count in zip(HISTOGRAM_BUCKETS, series[2], strict=True):
        metric.add_sample(f"{name}_bucket", {**labels, "le": repr(float(bound))}, count)
    metric.add_sample(f"{name}_bucket", {**labels, "le": "+Inf"}, series[3])
    metric.add_sample(f"{name}_count", labels, series[3])
    metric.add_sample(f"{name}_sum", labels, series[1])


def _log_record(raw: str, rec: dict[str, Any], value: float, dims: dict, hostname: str) -> None:
    """TorchServe's metric log line: ``Name.Unit:value|#dim:val,...|#hostname:h,timestamp``."""
    dimensions = ",".join(f"{k}:{v}" for k, v in dims.items())
    unit = rec.get("unit") or "unit"
    metrics_log.info(
        "[METRICS]%s.%s:%s|#%s|#hostname:%s,%d", raw, unit, value, dimensions, hostname, time.time()
    )
