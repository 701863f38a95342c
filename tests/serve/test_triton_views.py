"""Triton's model configuration as Lantern synthesises or completes it (serve/core/triton.py)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from serve.config import Config
from serve.core.observer import VersionTally
from serve.core.triton import _stats, model_config, output_labels
from serve.store.layouts import recognise
from serve.store.triton_config import LayoutError


def version(model_config_: dict[str, Any], workers: int = 1, **settings: Any) -> Any:
    merged = Config().default_model_settings().merged(settings)
    source = SimpleNamespace(model_config=model_config_, model_dir=Path("/nowhere"))
    return cast(Any, SimpleNamespace(name="m", source=source, settings=merged, min_workers=workers))


IMAGE = {"name": "image", "datatype": "FP32", "shape": [-1, 3, 8, 8]}
SCORES = {"name": "scores", "datatype": "FP32", "shape": [-1, 10]}


@pytest.mark.parametrize(
    ("model", "metadata", "expected"),
    [
        # an archive whose inputs have a batch dimension, batched by Lantern up to batchSize
        (
            version({}, 2, batchSize=4, maxBatchDelay=5),
            {"platform": "onnxruntime_onnx", "inputs": [IMAGE], "outputs": [SCORES]},
            {
                "name": "m",
                "platform": "onnxruntime_onnx",
                "max_batch_size": 4,
                "input": [{"name": "image", "data_type": "TYPE_FP32", "dims": ["3", "8", "8"]}],
                "output": [{"name": "scores", "data_type": "TYPE_FP32", "dims": ["10"]}],
                "dynamic_batching": {"max_queue_delay_microseconds": "5000"},
                "instance_group": [{"count": 2, "kind": "KIND_CPU"}],
                "version_policy": {"latest": {"num_versions": 1}},
            },
        ),
        # no batch dimension: max_batch_size 0, dims as they are
        (
            version({}, 1, deviceType="gpu", deviceIds=[1]),
            {"platform": "python", "inputs": [{"name": "t", "datatype": "BYTES", "shape": [1]}]},
            {
                "name": "m",
                "platform": "python",
                "input": [{"name": "t", "data_type": "TYPE_STRING", "dims": ["1"]}],
                "instance_group": [{"count": 1, "kind": "KIND_GPU", "gpus": [1]}],
                "version_policy": {"latest": {"num_versions": 1}},
            },
        ),
        # a config.pbtxt wins where it speaks
        (
            version(
                {
                    "tritonConfig": {"name": "m", "backend": "onnxruntime", "max_batch_size": 2},
                    "metadata": {"maxBatchSize": 2},
                },
                1,
                batchSize=2,
            ),
            {"platform": "onnxruntime_onnx", "inputs": [IMAGE]},
            {
                "name": "m",
                "backend": "onnxruntime",
                "max_batch_size": 2,
                "input": [{"name": "image", "data_type": "TYPE_FP32", "dims": ["3", "8", "8"]}],
                "dynamic_batching": {"max_queue_delay_microseconds": "100000"},
                "instance_group": [{"count": 1, "kind": "KIND_CPU"}],
                "version_policy": {"latest": {"num_versions": 1}},
            },
        ),
    ],
)
def test_model_config(model: Any, metadata: dict[str, Any], expected: dict[str, Any]) -> None:
    assert model_config(model, metadata) == expected


def test_a_config_with_unknown_keys_is_refused() -> None:
    with pytest.raises(LayoutError, match="malformed"):
        model_config(version({"tritonConfig": {"nonsense": 1}}), {})


def test_stats_shape() -> None:
    tally = VersionTally(success=3, success_seconds=0.5, fail=1, fail_seconds=0.25)
    tally.executions, tally.inferences, tally.queue_seconds = 2, 3, 0.125
    row = _stats(cast(Any, SimpleNamespace(name="m", version="1")), tally)
    assert row["inference_stats"]["success"] == {"count": 3, "ns": 500_000_000}
    assert row["inference_stats"]["fail"] == {"count": 1, "ns": 250_000_000}
    assert row["inference_stats"]["queue"] == {"count": 3, "ns": 125_000_000}
    assert (row["execution_count"], row["inference_count"]) == (2, 3)


def test_output_labels_read_from_the_model_folder(tmp_path: Path) -> None:
    (tmp_path / "m" / "1").mkdir(parents=True)
    (tmp_path / "m" / "1" / "model.onnx").write_text("")
    (tmp_path / "m" / "labels.txt").write_text("cat\ndog\n")
    (tmp_path / "m" / "config.pbtxt").write_text(
        'output [ { name: "p" data_type: TYPE_FP32 dims: [2] label_filename: "labels.txt" } ]'
    )
    from serve.store.layouts import open_version

    archive = open_version(recognise(tmp_path / "m"), "1", tmp_path / "dest")
    source = SimpleNamespace(model_config=archive.model_config, model_dir=archive.model_dir)
    assert output_labels(cast(Any, SimpleNamespace(source=source))) == {"p": ["cat", "dog"]}


@pytest.mark.parametrize(
    ("given", "stored"), [("none", None), ("", None), ("poll", "poll"), ("explicit", "explicit")]
)
def test_model_control_mode_values(given: str, stored: str | None) -> None:
    config = Config.load(env={}, overrides={"model_control_mode": given})
    assert config.model_control_mode == stored


def test_model_control_mode_refuses_others() -> None:
    from serve.config import ConfigError

    with pytest.raises(ConfigError, match="model_control_mode"):
        Config.load(env={}, overrides={"model_control_mode": "sometimes"})
