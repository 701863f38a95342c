"""TorchServe's ``metrics.yaml`` (``metrics_config``) and the switches around it.

The file has ``dimensions`` (YAML anchors only), ``ts_metrics`` (the frontend's own) and
``model_metrics`` (what handlers emit), each section a mapping of ``counter`` / ``gauge`` /
``histogram`` to a list of ``{name, unit, dimensions}``. Lantern uses ``model_metrics``: the
workers declare them before the handler starts (so ``context.metrics.get_metric`` finds them) and
the frontend exposes each under its declared type. Metrics a handler emits without declaring them
are exposed only when ``model_metrics_auto_detect`` is on: by default it is on without a
``metrics_config`` (Lantern's behaviour so far) and off with one (TorchServe's).

``metrics_mode``: ``prometheus`` exposes handler metrics on ``/metrics``; ``log`` and ``legacy``
write them to the model log instead (TorchServe's ``[METRICS]`` line format). Lantern's own
server metrics stay on ``/metrics`` in every mode.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from serve.config import Config, ConfigError

METRIC_TYPES = ("counter", "gauge", "histogram")


@dataclass(frozen=True)
class MetricSpec:
    """One declared metric."""

    name: str
    kind: str  # counter | gauge | histogram
    unit: str
    dimensions: tuple[str, ...]


@dataclass(frozen=True)
class MetricsPolicy:
    """What the frontend does with handler metrics (workers read ``metrics_config`` themselves
    to declare its ``model_metrics``)."""

    mode: str = "prometheus"
    auto_detect: bool = True
    model_metrics: dict[str, MetricSpec] = field(default_factory=dict)  # by name

    @property
    def exposed(self) -> bool:
        """Handler metrics go to ``/metrics`` (else to the model log)."""
        return self.mode == "prometheus"


def parse_section(section: Any, where: str) -> dict[str, MetricSpec]:
    """``{counter: [{name, unit, dimensions}], ...}`` -> specs by name; `ConfigError` if bad."""
    if section is None:
        return {}
    if not isinstance(section, Mapping):
        raise ConfigError(f"{where} must map metric types to lists of metrics")
    specs: dict[str, MetricSpec] = {}
    for kind, entries in section.items():
        if str(kind).lower() not in METRIC_TYPES:
            raise ConfigError(f"{where}: unknown metric type {kind!r} ({', '.join(METRIC_TYPES)})")
        for entry in entries or []:
            if not isinstance(entry, Mapping) or "name" not in entry or "unit" not in entry:
                raise ConfigError(f"{where}.{kind}: each metric needs a name and a unit: {entry!r}")
            dims = entry.get("dimensions") or []
            if not isinstance(dims, list) or not all(isinstance(d, str) for d in dims):
                raise ConfigError(f"{where}.{kind}.{entry['name']}: dimensions must be names")
            name = str(entry["name"])
            specs[name] = MetricSpec(name, str(kind).lower(), str(entry["unit"]), tuple(dims))
    return specs


def load_policy(config: Config) -> MetricsPolicy:
    """The policy ``config`` describes; reads ``metrics_config`` when set."""
    mode = str(config.metrics_mode).lower()
    section: dict[str, Any] = {}
    if config.metrics_config:
        path = Path(config.metrics_config)
        try:
            document = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(f"Config 'metrics_config': cannot read {path}: {exc}") from exc
        if not isinstance(document, Mapping):
            raise ConfigError(f"Config 'metrics_config': {path} must hold a mapping")
        parse_section(document.get("ts_metrics"), "ts_metrics")  # checked, not used
        section = document.get("model_metrics") or {}
    model_metrics = parse_section(section, "model_metrics")
    auto = config.model_metrics_auto_detect
    if auto is None:
        auto = not config.metrics_config
    return MetricsPolicy(
        mode=mode,
        auto_detect=bool(auto),
        model_metrics=model_metrics,
    )
