"""metrics.yaml, model_metrics_auto_detect and metrics_mode, and TorchServe's exposed names."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from serve.config import Config, ConfigError
from serve.metrics.config import MetricSpec, MetricsPolicy, load_policy
from serve.metrics.exposition import render
from serve.metrics.handler import HandlerMetrics

YAML = """
dimensions:
  - &model_name "ModelName"
ts_metrics:
  counter:
    - name: Requests2XX
      unit: Count
      dimensions: []
model_metrics:
  counter:
    - name: Calls
      unit: count
      dimensions: [*model_name]
  gauge:
    - name: Declared
      unit: ms
      dimensions: []
  histogram:
    - name: Sizes
      unit: kB
      dimensions: []
"""


def record(name: str, value: float, kind: str = "counter", **dims: str) -> dict:
    return {"name": name, "unit": "Count", "type": kind, "value": value, "dimensions": dims}


def exposition(h: HandlerMetrics) -> str:
    return render(h.collect()).decode()


def test_policy_reads_model_metrics_and_defaults_auto_detect(tmp_path: Path) -> None:
    path = tmp_path / "metrics.yaml"
    path.write_text(YAML)
    policy = load_policy(Config(metrics_config=str(path)))
    assert policy.model_metrics["Calls"] == MetricSpec("Calls", "counter", "count", ("ModelName",))
    assert policy.model_metrics["Sizes"].kind == "histogram"
    assert policy.auto_detect is False  # with a metrics_config, as TorchServe's default
    assert load_policy(Config()).auto_detect is True  # without one: every handler metric
    assert load_policy(Config(metrics_config=str(path), model_metrics_auto_detect=True)).auto_detect
    assert load_policy(Config(metrics_mode="LOG")).exposed is False


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("model_metrics:\n  counter:\n    - name: X\n", "needs a name and a unit"),
        ("model_metrics:\n  summary:\n    - {name: X, unit: ms}\n", "unknown metric type"),
        ("model_metrics: [1, 2]\n", "must map metric types"),
        ("model_metrics:\n  gauge:\n    - {name: X, unit: ms, dimensions: a}\n", "dimensions"),
        ("- just a list\n", "must hold a mapping"),
        ("{unclosed: [\n", "cannot read"),
    ],
)
def test_a_broken_metrics_yaml_stops_the_server_with_its_reason(
    tmp_path: Path, text: str, message: str
) -> None:
    path = tmp_path / "metrics.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_policy(Config(metrics_config=str(path)))


def test_metrics_mode_is_checked() -> None:
    with pytest.raises(ConfigError, match="metrics_mode"):
        Config.from_mapping({"metrics_mode": "statsd"})
    assert Config.from_mapping({"metrics_mode": "legacy"}).metrics_mode == "legacy"


def test_counters_keep_their_own_name_without_total() -> None:
    h = HandlerMetrics("host")
    h.record([record("InferenceRequestCount", 1), record("InferenceRequestCount", 2)])
    text = exposition(h)
    assert "# TYPE InferenceRequestCount counter\n" in text
    assert 'InferenceRequestCount{Hostname="host"} 3.0\n' in text
    assert "InferenceRequestCount_total" not in text
    # Still valid Prometheus text: the parser reads it as a counter.
    [family] = list(text_string_to_metric_families(text))
    assert (family.name, family.type) == ("InferenceRequestCount", "counter")


def test_declared_types_win_and_undeclared_metrics_follow_auto_detect() -> None:
    declared = {
        "Calls": MetricSpec("Calls", "counter", "count", ("ModelName",)),
        "Sizes": MetricSpec("Sizes", "histogram", "kB", ()),
    }
    h = HandlerMetrics("host", policy=MetricsPolicy(auto_detect=False, model_metrics=declared))
    h.record([record("Calls", 1, "gauge", ModelName="m"), record("Stray", 1)])
    h.record([record("Sizes", 0.3, "gauge"), record("Sizes", 20, "gauge")])
    families = {f.name: f for f in text_string_to_metric_families(exposition(h))}
    assert set(families) == {"Calls", "Sizes"}  # Stray: not declared, not auto-detected
    assert families["Calls"].type == "counter"  # the yaml's type, whatever the record says
    sizes = {(s.name, s.labels.get("le")): s.value for s in families["Sizes"].samples}
    assert sizes[("Sizes_bucket", "0.25")] == 0
    assert sizes[("Sizes_bucket", "0.5")] == 1
    assert sizes[("Sizes_bucket", "+Inf")] == 2
    assert (sizes[("Sizes_count", None)], sizes[("Sizes_sum", None)]) == (2, 20.3)


def test_log_mode_writes_metric_lines_instead_of_exposing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    h = HandlerMetrics("host", policy=MetricsPolicy(mode="log"))
    with caplog.at_level(logging.INFO, logger="serve.worker.metrics"):
        h.record([record("Calls", 2, ModelName="m")])
    assert exposition(h) == ""
    [line] = [r.getMessage() for r in caplog.records if r.name == "serve.worker.metrics"]
    assert line.startswith("[METRICS]Calls.Count:2.0|#ModelName:m|#hostname:host,")
