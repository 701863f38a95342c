"""Handler-side custom metrics: TorchServe's ``context.metrics`` API, buffered for the worker.

TorchServe's backend prints each update as a ``[METRICS]`` log line that the frontend parses. Here
each update becomes a record in a bounded buffer, and the worker ships ``MetricsStore.drain()`` to
the frontend with the batch response.

Differences from TorchServe (``ts.metrics.metric_cache_abstract``):

* Every metric gets the ``ModelName`` and ``Level=Model`` dimensions unless given; TorchServe uses
  ``Level=Error`` when the batch had no request ids, which is an accident of its code.
* Dimensions may be ``Dimension`` objects, ``{"name": .., "value": ..}`` dicts, ``(name, value)``
  pairs, or one ``{name: value}`` mapping.
* An update whose dimension names differ from the metric's first use is kept with its own
  dimensions rather than dropped.
"""

from __future__ import annotations

import enum
import logging
import numbers
import threading
from collections import deque
from collections.abc import Iterable, Mapping
from typing import Any

logger = logging.getLogger(__name__)

# TorchServe's unit shorthands (ts/metrics/unit.py); other strings pass through unchanged.
UNITS: dict[str | None, str] = {
    "ms": "Milliseconds",
    "s": "Seconds",
    "percent": "Percent",
    "count": "Count",
    "MB": "Megabytes",
    "GB": "Gigabytes",
    "kB": "Kilobytes",
    "B": "Bytes",
    "": "unit",
    None: "unit",
}

DEFAULT_MAX_PENDING = 10_000


class MetricTypes(enum.Enum):
    """Metric kinds, as ``ts.metrics.metric_type_enum.MetricTypes``."""

    COUNTER = "counter"
    GAUGE = "gauge"
    HISTOGRAM = "histogram"


class MetricsCacheKeyError(KeyError):
    """No metric of that name and type has been added."""


class MetricsCacheValueError(ValueError):
    """A metric argument has an unsupported value (e.g. a time unit other than ms or s)."""


class MetricsCacheTypeError(TypeError):
    """A metric argument has the wrong type."""


class MetricsCacheIOError(OSError):
    """A ``metrics.yaml`` cannot be read."""


class MetricsCachePyYamlError(ValueError):
    """A ``metrics.yaml`` is not valid YAML."""


class GeneralMetricsCacheError(Exception):
    """Any other problem with a ``metrics.yaml``."""


class Dimension:
    """One metric dimension (label), as ``ts.metrics.dimension.Dimension``."""

    def __init__(self, name: str, value: Any) -> None:
        self.name = name
        self.value = value

    def __str__(self) -> str:
        return f"{self.name}:{self.value}"

    def __repr__(self) -> str:
        return f"Dimension({self.name!r}, {self.value!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Dimension) and (self.name, self.value) == (other.name, other.value)

    def __hash__(self) -> int:
        return hash((self.name, str(self.value)))

    def to_dict(self) -> dict[str, Any]:
        return {"Name": self.name, "Value": self.value}


def _as_metric_type(metric_type: MetricTypes | str) -> MetricTypes:
    if isinstance(metric_type, MetricTypes):
        return metric_type
    # Accept the real ts enum (same values) or a plain string.
    value = getattr(metric_type, "value", metric_type)
    try:
        return MetricTypes(str(value).lower())
    except ValueError:
        raise MetricsCacheTypeError(
            f"metric_type must be one of counter, gauge, histogram, not {metric_type!r}"
        ) from None


def normalize_dimensions(dimensions: Any) -> list[Dimension]:
    """Turn any accepted dimensions form into a fresh list of ``Dimension`` objects."""
    if dimensions is None:
        return []
    if isinstance(dimensions, Mapping) and not _is_name_value_dict(dimensions):
        return [Dimension(str(k), v) for k, v in dimensions.items()]
    if isinstance(dimensions, Mapping):
        dimensions = [dimensions]
    if not isinstance(dimensions, Iterable) or isinstance(dimensions, (str, bytes)):
        raise MetricsCacheTypeError("dimensions must be a list of Dimension objects or dicts")
    result = []
    for dim in dimensions:
        if isinstance(dim, Mapping) and _is_name_value_dict(dim):
            name = dim.get("name", dim.get("Name"))
            result.append(Dimension(str(name), dim.get("value", dim.get("Value"))))
        elif hasattr(dim, "name") and hasattr(dim, "value"):
            result.append(Dimension(str(dim.name), dim.value))
        elif isinstance(dim, (tuple, list)) and len(dim) == 2:
            result.append(Dimension(str(dim[0]), dim[1]))
        else:
            raise MetricsCacheTypeError(f"unsupported dimension {dim!r}")
    return result


def _is_name_value_dict(d: Mapping) -> bool:
    return ("name" in d and "value" in d) or ("Name" in d and "Value" in d)


class CachingMetric:
    """A named metric of one type and unit; each update is recorded in its store."""

    def __init__(
        self,
        metric_name: str,
        unit: str,
        dimension_names: list[str] | None = None,
        metric_type: MetricTypes = MetricTypes.COUNTER,
        store: MetricsStore | None = None,
    ) -> None:
        self.metric_name = metric_name
        self.unit = UNITS.get(unit, unit)
        self.dimension_names = list(dimension_names or [])
        self.metric_type = _as_metric_type(metric_type)
        self._store = store

    def add_or_update(
        self, value: float, dimension_values: list | None = None, request_id: str | None = ""
    ) -> None:
        """Record one update; values pair with ``dimension_names`` in order."""
        values = list(dimension_values or [])
        if len(values) != len(self.dimension_names):
            logger.error(
                "[METRICS] dropped %s: dimension values %s do not match names %s",
                self.metric_name,
                values,
                self.dimension_names,
            )
            return
        dims = [Dimension(n, v) for n, v in zip(self.dimension_names, values, strict=True)]
        self._record(value, dims)

    def update(
        self, value: float, request_id: str | None = "", dimensions: list | None = None
    ) -> None:
        """Backwards-compatible update that also replaces the dimension names."""
        dims = normalize_dimensions(dimensions)
        self.dimension_names = [d.name for d in dims]
        self._record(value, dims)

    def _record(self, value: Any, dims: list[Dimension]) -> None:
        number = _as_number(value)
        if number is None:
            logger.error("[METRICS] dropped %s: value %r is not a number", self.metric_name, value)
            return
        if self.metric_type is MetricTypes.COUNTER and number < 0:
            logger.error("[METRICS] dropped %s: counter increment %s < 0", self.metric_name, number)
            return
        if self._store is not None:
            self._store._append(
                {
                    "name": self.metric_name,
                    "unit": self.unit,
                    "type": self.metric_type.value,
                    "value": number,
                    "dimensions": {d.name: str(d.value) for d in dims},
                }
            )


def _as_number(value: Any) -> float | int | None:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, numbers.Real):
        return value if isinstance(value, (int, float)) else float(value)
    try:
        # numpy / torch scalars
        return float(value)
    except (TypeError, ValueError):
        return None


class MetricsStore:
    """``context.metrics``: TorchServe's metric cache API; ``drain()`` hands records over."""

    def __init__(self, model_name: str | None = None, max_pending: int = DEFAULT_MAX_PENDING):
        self.model_name = model_name
        self.request_ids: dict[int, str] | None = None
        self.cache: dict[MetricTypes, dict[str, CachingMetric]] = {}
        self._pending: deque[dict] = deque(maxlen=max_pending)
        self._lock = threading.Lock()

    def set_request_ids(self, request_ids: dict[int, str] | None) -> None:
        self.request_ids = request_ids

    # -- TorchServe API -------------------------------------------------------------------------

    def add_metric(
        self,
        name: str,
        value: float,
        unit: str,
        idx: int | None = None,
        dimensions: Any = None,
        metric_type: MetricTypes | str = MetricTypes.COUNTER,
    ) -> None:
        """Record a metric of any type and unit (default type: counter)."""
        self._add(name, value, unit, dimensions, metric_type)

    def add_counter(
        self, name: str, value: float, idx: int | None = None, dimensions: Any = None
    ) -> None:
        """Increment a counter (unit Count)."""
        self._add(name, value, "count", dimensions, MetricTypes.COUNTER)

    def add_time(
        self,
        name: str,
        value: float,
        idx: int | None = None,
        unit: str = "ms",
        dimensions: Any = None,
        metric_type: MetricTypes | str = MetricTypes.GAUGE,
    ) -> None:
        """Record a duration in ms or s (default type: gauge)."""
        if unit not in ("ms", "s"):
            raise MetricsCacheValueError("the unit for a timed metric should be one of ['ms', 's']")
        self._add(name, value, unit, dimensions, metric_type)

    def add_size(
        self,
        name: str,
        value: float,
        idx: int | None = None,
        unit: str = "MB",
        dimensions: Any = None,
        metric_type: MetricTypes | str = MetricTypes.GAUGE,
    ) -> None:
        """Record a size in MB, kB, GB or B (default type: gauge)."""
        if unit not in ("MB", "kB", "GB", "B"):
            raise MetricsCacheValueError(
                "The unit for size based metric is one of ['MB','kB', 'GB', 'B']"
            )
        self._add(name, value, unit, dimensions, metric_type)

    def add_percent(
        self,
        name: str,
        value: float,
        idx: int | None = None,
        dimensions: Any = None,
        metric_type: MetricTypes | str = MetricTypes.GAUGE,
    ) -> None:
        """Record a percentage (default type: gauge)."""
        self._add(name, value, "percent", dimensions, metric_type)

    def add_error(self, name: str, value: float, dimensions: Any = None) -> None:
        """Count an error (counter, Level=Error)."""
        dims = normalize_dimensions(dimensions)
        if "Level" not in {d.name for d in dims}:
            dims.append(Dimension("Level", "Error"))
        self._add(name, value, "", dims, MetricTypes.COUNTER)

    def get_metric(
        self, metric_name: str, metric_type: MetricTypes | str = MetricTypes.COUNTER
    ) -> CachingMetric:
        """The metric added under this name and type; ``MetricsCacheKeyError`` if none."""
        mtype = _as_metric_type(metric_type)
        try:
            return self.cache[mtype][metric_name]
        except KeyError:
            raise MetricsCacheKeyError(
                f"Metric of type '{mtype}' and name '{metric_name}' doesn't exist"
            ) from None

    def add_metric_to_cache(
        self,
        metric_name: str,
        unit: str,
        dimension_names: list[str] | None = None,
        metric_type: MetricTypes | str = MetricTypes.COUNTER,
    ) -> CachingMetric:
        """Declare (or redeclare) a metric and return it for ``add_or_update`` calls."""
        if not isinstance(metric_name, str):
            raise MetricsCacheTypeError("`metric_name` must be a str")
        if not isinstance(unit, str):
            raise MetricsCacheTypeError("`unit` must be a str")
        if dimension_names is not None and not isinstance(dimension_names, list):
            raise MetricsCacheTypeError(
                "`dimension_names` should be a list of dimension name strings"
            )
        mtype = _as_metric_type(metric_type)
        metric = CachingMetric(metric_name, unit, dimension_names, mtype, store=self)
        self.cache.setdefault(mtype, {})[metric_name] = metric
        return metric

    def declare(self, model_metrics: Mapping[str, Any] | None) -> None:
        """Declare the ``model_metrics`` section of a ``metrics.yaml`` (``{type: [{name, unit,
        dimensions}]}``), so that ``get_metric`` finds them before their first update."""
        for type_name, specs in (model_metrics or {}).items():
            try:
                mtype = MetricTypes(str(type_name).lower())
            except ValueError:
                raise MetricsCacheKeyError(f"Invalid metric type: {type_name!r}") from None
            for spec in specs or []:
                try:
                    name, unit = spec["name"], spec["unit"]
                    dimension_names = spec.get("dimensions") or []
                except (KeyError, TypeError, AttributeError) as exc:
                    raise MetricsCacheKeyError(f"Key not found in cache spec: {exc}") from None
                self.add_metric_to_cache(name, str(unit), list(dimension_names), mtype)

    def cache_keys(self) -> list[str]:
        """``"<type>:<name>"`` for every declared metric."""
        return [f"{t.value}:{name}" for t, metrics in self.cache.items() for name in metrics]

    # -- Lantern --------------------------------------------------------------------------------

    def drain(self) -> list[dict]:
        """Return and forget the records since the last drain.

        Each is ``{"name", "unit", "type": counter|gauge|histogram, "value", "dimensions"}``.
        """
        with self._lock:
            records = list(self._pending)
            self._pending.clear()
        return records

    def _add(
        self, name: str, value: float, unit: str, dimensions: Any, metric_type: MetricTypes | str
    ) -> None:
        mtype = _as_metric_type(metric_type)
        dims = self._with_default_dims(normalize_dimensions(dimensions))
        try:
            metric = self.get_metric(name, mtype)
        except MetricsCacheKeyError:
            metric = self.add_metric_to_cache(name, unit, [d.name for d in dims], mtype)
        metric._record(value, dims)

    def _with_default_dims(self, dims: list[Dimension]) -> list[Dimension]:
        names = {d.name for d in dims}
        if "ModelName" not in names and self.model_name is not None:
            dims.append(Dimension("ModelName", self.model_name))
        if "Level" not in names:
            dims.append(Dimension("Level", "Model"))
        return dims

    def _append(self, record: dict) -> None:
        with self._lock:
            if len(self._pending) == self._pending.maxlen:
                logger.warning("[METRICS] buffer full; dropping the oldest record")
            self._pending.append(record)


def read_metrics_yaml(path: str) -> dict[str, Any]:
    """A ``metrics.yaml`` as a dict (``yaml.safe_load``), with TorchServe's error types."""
    import yaml

    try:
        with open(path, encoding="utf-8") as f:
            parsed = yaml.safe_load(f)
    except yaml.YAMLError as exc:
        raise MetricsCachePyYamlError(f"Error parsing file {path}: {exc}") from exc
    except OSError as exc:
        raise MetricsCacheIOError(f"Error reading file {path}: {exc}") from exc
    if not isinstance(parsed, dict):
        raise GeneralMetricsCacheError(f"{path} does not hold a mapping of metric sections")
    return parsed


class MetricsCacheYamlImpl(MetricsStore):
    """``ts.metrics.metric_cache_yaml_impl``: a store whose ``initialize_cache`` declares the
    ``model_metrics`` of a ``metrics.yaml``."""

    def __init__(self, config_file_path: str) -> None:
        super().__init__()
        if not config_file_path:
            raise MetricsCacheTypeError("Config file not initialized")
        self.config_file_path = config_file_path
        self._parsed_file = read_metrics_yaml(config_file_path)

    def initialize_cache(self) -> None:
        section = self._parsed_file.get("model_metrics")
        if not section:
            raise MetricsCacheValueError("Missing `model_metrics` specification")
        self.declare(section)


class LegacyMetric:
    """``ts.metrics.metric.Metric``: one named value with fixed dimensions (a counter)."""

    def __init__(
        self,
        name: str,
        value: float,
        unit: str,
        dimensions: list,
        request_id: str | None = None,
        metric_method: str | None = None,
        store: MetricsStore | None = None,
    ) -> None:
        self.metric_type = MetricTypes.COUNTER
        self.dimensions = normalize_dimensions(dimensions)
        self.dimension_names = [d.name for d in self.dimensions]
        self.dimension_values = [d.value for d in self.dimensions]
        self._caching_metric = CachingMetric(name, unit, self.dimension_names, store=store)
        self.name = name
        self.unit = self._caching_metric.unit
        self.metric_method = metric_method
        self.value = value
        self.request_id = request_id

    def update(self, value: float) -> None:
        self.value = value
        self._caching_metric.add_or_update(value, self.dimension_values, self.request_id)

    def reset(self) -> None:
        self.update(0)

    def __str__(self) -> str:
        import socket
        import time

        dims = ",".join(str(d) for d in self.dimensions)
        text = f"{self.name}.{self.unit}:{self.value}|#{dims}|#hostname:{socket.gethostname()},"
        text += f"{int(time.time())}"
        return f"{text},{self.request_id}" if self.request_id else text

    def to_dict(self) -> dict[str, Any]:
        import socket
        import time

        return {
            "MetricName": self.name,
            "Value": self.value,
            "Unit": self.unit,
            "Dimensions": self.dimensions,
            "Timestamp": int(time.time()),
            "HostName": socket.gethostname(),
            "RequestId": self.request_id,
        }
