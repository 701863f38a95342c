"""config.pbtxt parsed and mapped onto Lantern's settings (serve/store/triton_config.py): tables."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from handlers.exceptions import InvalidTensorInput
from handlers.tensor_models import Job as TensorJob
from handlers.tensor_models import ModelAdapter, Outputs, TensorSpec, check_feeds, run_jobs
from serve.config import Config
from serve.store.triton_config import (
    LayoutError,
    config_as_json,
    config_from_json,
    map_config,
    parse_config_text,
)
from serve.wire import OIP, PROTOCOL_HEADER
from serve.worker.warmup import triton_frames


def mapped(text: str) -> tuple[dict[str, Any], list[str]]:
    out = map_config(parse_config_text(text, "m/config.pbtxt"), "m/config.pbtxt")
    return out.model_config, out.not_honoured


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # no batching: one request per run, shapes as given
        ("max_batch_size: 0", {"batchSize": 1}),
        # batching without the scheduler: clients batch, Lantern does not merge requests
        ("max_batch_size: 8", {"batchSize": 1}),
        ("max_batch_size: 8 dynamic_batching { }", {"batchSize": 8, "maxBatchDelay": 0}),
        (
            "max_batch_size: 8 dynamic_batching { preferred_batch_size: [2, 4] "
            "max_queue_delay_microseconds: 1500 }",
            {"batchSize": 4, "maxBatchDelay": 2},
        ),
        (
            "max_batch_size: 4 dynamic_batching { default_queue_policy { max_queue_size: 7 "
            "default_timeout_microseconds: 2500000 } }",
            {"batchSize": 4, "jobQueueSize": 7, "responseTimeout": 2.5},
        ),
        # dynamic_batching without batching (max_batch_size 0) is ignored, as Triton refuses it
        ("dynamic_batching { }", {"batchSize": 1}),
        (
            "instance_group [ { count: 2 kind: KIND_CPU } ]",
            {"minWorkers": 2, "maxWorkers": 2, "deviceType": "cpu"},
        ),
        (
            "instance_group [ { count: 2 kind: KIND_GPU gpus: [0, 1] } ]",
            {"minWorkers": 4, "maxWorkers": 4, "deviceType": "gpu", "deviceIds": [0, 1]},
        ),
        ("instance_group [ { } ]", {"minWorkers": 1, "maxWorkers": 1}),
        ("version_policy { all { } }", {"versionPolicy": "all"}),
        ("version_policy { latest { num_versions: 2 } }", {"versionPolicy": {"latest": 2}}),
        (
            "version_policy { specific { versions: [1, 3] } }",
            {"versionPolicy": {"specific": ["1", "3"]}},
        ),
        (
            'parameters { key: "mode" value: { string_value: "fast" } }',
            {"parameters": {"mode": "fast"}},
        ),
    ],
)
def test_settings(text: str, expected: dict[str, Any]) -> None:
    settings, _ = mapped(text)
    for key, value in expected.items():
        assert settings[key] == value, key
    # what Lantern reads: the camelCase keys become ModelSettings
    model = Config().default_model_settings().merged(settings)
    assert model.batch_size == settings["batchSize"]


@pytest.mark.parametrize(
    ("text", "inputs"),
    [
        (
            'max_batch_size: 8 input [ { name: "x" data_type: TYPE_FP32 dims: [ 3, -1 ] } ]',
            [{"name": "x", "datatype": "FP32", "shape": [-1, 3, -1]}],
        ),
        (
            'input [ { name: "s" data_type: TYPE_STRING dims: [ 1 ] } ]',
            [{"name": "s", "datatype": "BYTES", "shape": [1]}],
        ),
        (
            'max_batch_size: 2 input [ { name: "img" data_type: TYPE_UINT8 dims: [ 12 ] '
            "reshape: { shape: [ 3, 4 ] } } ]",
            [{"name": "img", "datatype": "UINT8", "shape": [-1, 12], "reshape": [3, 4]}],
        ),
    ],
)
def test_tensors(text: str, inputs: list[dict[str, Any]]) -> None:
    settings, _ = mapped(text)
    assert settings["metadata"]["inputs"] == inputs


def test_warmup_samples() -> None:
    settings, named = mapped(
        "max_batch_size: 4 model_warmup [ { name: 'w' batch_size: 2 count: 3 inputs { key: 'x' "
        "value: { data_type: TYPE_FP32 dims: [ 5 ] random_data: true } } } ]"
    )
    assert settings["tritonWarmup"] == [
        {
            "name": "w",
            "count": 3,
            "inputs": {"x": {"datatype": "FP32", "shape": [2, 5], "random": True}},
        }
    ]
    assert named == []
    frames = triton_frames(settings["tritonWarmup"])
    assert len(frames) == 3 and frames[0].meta["requests"][0]["headers"] == {PROTOCOL_HEADER: OIP}


def test_platform_from_backend_and_labels() -> None:
    settings, _ = mapped(
        'backend: "onnxruntime" output [ { name: "p" data_type: TYPE_FP32 dims: [ 3 ] '
        'label_filename: "labels.txt" } ]'
    )
    assert settings["metadata"]["platform"] == "onnxruntime_onnx"
    assert settings["metadata"]["labels"] == {"p": "labels.txt"}


@pytest.mark.parametrize(
    ("text", "not_honoured"),
    [
        ("max_batch_size: 1", []),
        ("response_cache { enable: true }", ["response_cache"]),
        (
            "model_warmup [ { name: 'w' inputs { key: 'x' value: { data_type: TYPE_FP32 "
            "dims: [2] input_data_file: 'x.bin' } } } ]",
            ["model_warmup.input_data_file"],
        ),
        (
            "max_batch_size: 2 dynamic_batching { priority_levels: 2 preserve_ordering: true }",
            ["dynamic_batching.priority_levels", "dynamic_batching.preserve_ordering"],
        ),
        ("instance_group [ { count: 1 passive: true } ]", ["instance_group.passive"]),
        ("sequence_batching { }", ["sequence_batching"]),
        ("ensemble_scheduling { }", ["ensemble_scheduling"]),
    ],
)
def test_not_honoured_named(text: str, not_honoured: list[str]) -> None:
    _, named = mapped(text)
    for name in not_honoured:
        assert name in named
    if not not_honoured:
        assert named == []


@pytest.mark.parametrize(
    "text",
    ["max_batch_size: [[", "input [ { name: 'x' data_type: TYPE_NOPE } ]", "nope: 1", "name: "],
)
def test_malformed_names_the_file(text: str) -> None:
    with pytest.raises(LayoutError, match="m/config.pbtxt: malformed model configuration"):
        parse_config_text(text, "m/config.pbtxt")


def test_json_round_trip() -> None:
    config = parse_config_text('name: "m" max_batch_size: 4', "c")
    data = config_as_json(config)
    assert data == {"name": "m", "max_batch_size": 4}
    assert config_from_json(data, "c") == config
    with pytest.raises(LayoutError, match="malformed"):
        config_from_json({"max_batch_size": "many"}, "load request")


# ----- what the tensor path does with them -----------------------------------------------------


class Flatten(ModelAdapter):
    """Records the shapes it was given; answers the input flattened per row."""

    def __init__(self) -> None:
        super().__init__([TensorSpec("x", "FP32", [-1, 6])], [TensorSpec("y", "FP32", [-1, 6])])
        self.seen: list[tuple[int, ...]] = []

    def run(self, feeds: Any) -> Outputs:
        array = feeds["x"][0]
        self.seen.append(array.shape)
        return [("y", array.reshape(array.shape[0], -1), "FP32")]


def test_max_batch_size_refused_with_tritons_words() -> None:
    adapter = Flatten()
    adapter.apply_declared({"metadata": {"maxBatchSize": 2}})
    check_feeds(adapter, {"x": (np.zeros((2, 6), np.float32), "FP32")}, "m", strict=True)
    with pytest.raises(
        InvalidTensorInput, match="inference request batch-size must be <= 2 for 'm'"
    ):
        check_feeds(adapter, {"x": (np.zeros((3, 6), np.float32), "FP32")}, "m", strict=True)


def test_reshape_in_and_out() -> None:
    adapter = Flatten()
    adapter.apply_declared(
        {
            "metadata": {
                "maxBatchSize": 4,
                "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 6], "reshape": [2, 3]}],
                "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, 3, 2], "reshape": [6]}],
            }
        }
    )
    x = np.arange(12, dtype=np.float32).reshape(2, 6)
    results = run_jobs(adapter, [TensorJob(0, {"x": (x, "FP32")})])
    assert adapter.seen == [(2, 2, 3)]
    outputs = results[0]
    assert not isinstance(outputs, Exception)
    assert outputs[0][1].shape == (2, 3, 2)
