"""Metrics that handlers add with ``context.metrics``, kept in the frontend for Prometheus."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator, Sequence
from typing import Any

from prometheus_client.metrics_core import Metric

logger = logging.getLogger(__name__)

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

    Counters add up; gauges (and histograms, which TorchServe's frontend shows as gauges) keep
    the last value. Names and label names are sanitised; names that would shadow the server's
    own families get a ``handler_`` prefix. Cardinality is bounded: at most ``max_metrics``
    names and ``max_series`` label sets per name, label values cut to ``max_value_length``.
    """

    def __init__(
        self,
        hostname: str,
        *,
        max_metrics: int = 256,
        max_series: int = 1000,
        max_value_length: int = 200,
    ) -> None:
        self.hostname = hostname
        self.max_metrics = max_metrics
        self.max_series = max_series
        self.max_value_length = max_value_length
        self._by_raw: dict[str, _Family | None] = {}  # None: refused, already logged
        self._by_key: dict[str, _Family] = {}  # the exposed name without _total
        self._type_warned: set[str] = set()

    def describe(self) -> list[Metric]:
        return []

    def record(self, records: Sequence[dict[str, Any]]) -> None:
        """Apply records of ``{"name", "unit", "type", "value", "dimensions"}``."""
        for rec in records:
            try:
                raw = rec["name"]
                value = float(rec["value"])
                kind = "counter" if rec.get("type") == "counter" else "gauge"
                dims = rec.get("dimensions") or {}
                key = tuple(dims.items())
                hash(key)  # dimension values arrive from JSON: refuse lists and dicts
            except (KeyError, TypeError, ValueError, AttributeError):
                continue
            if not isinstance(raw, str):
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
        key = name.removesuffix("_total")
        family = self._by_key.get(key)
        if family is None:
            if kind == "counter":
                name = key  # exposed as key_total
            family = self._by_key[key] = _Family(name, kind, unit)
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
        return series

    def collect(self) -> Iterator[Metric]:
        for family in list(self._by_key.values()):
            doc = f"Handler metric ({family.kind}) with unit: {family.unit or 'unit'}"
            metric = Metric(family.name, doc, family.kind)
            sample = f"{family.name}_total" if family.kind == "counter" else family.name
            for labels, value in list(family.series.values()):
                metric.add_sample(sample, labels, value)
            yield metric
