"""TF Serving's batching parameters mapped onto a model's batching settings (sans-IO but a read).

``--batching_parameters_file`` (every model) and a version's own
``assets.extra/batching_params.pbtxt`` (TF Serving's per-model file, which wins) are
``BatchingParameters`` in protobuf text format. Lantern batches every model in its frontend
queue; the fields map onto the model-config.yaml keys that queue reads:

| TF Serving | Lantern |
| --- | --- |
| ``max_batch_size`` | ``batchSize`` |
| ``batch_timeout_micros`` | ``maxBatchDelay`` (milliseconds, rounded up) |
| ``max_enqueued_batches`` | ``jobQueueSize`` (× ``max_batch_size``: Lantern counts requests) |
| ``num_batch_threads`` | ``minWorkers`` and ``maxWorkers`` (one batch per worker at a time) |

The others (``allowed_batch_sizes``, ``pad_variable_length_inputs``, ``thread_pool_name``, large
batch splitting) have no equivalent; `BatchingSettings.not_honoured` names those that were set.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from google.protobuf import text_format

from serve.grpc.gen.tensorflow_serving.servables.tensorflow import session_bundle_config_pb2

PER_MODEL = Path("assets.extra") / "batching_params.pbtxt"


class BatchingError(ValueError):
    """A batching parameters file that cannot be used; the message names it."""


@dataclass(frozen=True)
class BatchingSettings:
    settings: dict[str, Any] = field(default_factory=dict)  # model-config.yaml keys
    not_honoured: tuple[str, ...] = ()


def parse_batching(text: str, where: str) -> BatchingSettings:
    params = session_bundle_config_pb2.BatchingParameters()
    try:
        text_format.Parse(text, params)
    except text_format.ParseError as exc:
        raise BatchingError(f"{where}: not a BatchingParameters: {exc}") from None
    settings: dict[str, Any] = {}
    if params.HasField("max_batch_size"):
        if params.max_batch_size.value < 1:
            raise BatchingError(f"{where}: max_batch_size must be at least 1")
        settings["batchSize"] = int(params.max_batch_size.value)
    if params.HasField("batch_timeout_micros"):
        micros = int(params.batch_timeout_micros.value)
        if micros < 0:
            raise BatchingError(f"{where}: batch_timeout_micros cannot be negative")
        settings["maxBatchDelay"] = math.ceil(micros / 1000)
    if params.HasField("max_enqueued_batches"):
        batches = int(params.max_enqueued_batches.value)
        if batches < 1:
            raise BatchingError(f"{where}: max_enqueued_batches must be at least 1")
        settings["jobQueueSize"] = batches * int(settings.get("batchSize", 1))
    if params.HasField("num_batch_threads"):
        threads = int(params.num_batch_threads.value)
        if threads < 1:
            raise BatchingError(f"{where}: num_batch_threads must be at least 1")
        settings["minWorkers"] = settings["maxWorkers"] = threads
    ignored = [
        name
        for name in ("thread_pool_name", "enable_large_batch_splitting", "max_execution_batch_size")
        if params.HasField(name)
    ]
    if params.allowed_batch_sizes:
        ignored.append("allowed_batch_sizes")
    if params.pad_variable_length_inputs:
        ignored.append("pad_variable_length_inputs")
    return BatchingSettings(settings, tuple(ignored))


def read_batching(path: Path) -> BatchingSettings:
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise BatchingError(f"{path}: cannot be read: {exc}") from None
    return parse_batching(text, str(path))
