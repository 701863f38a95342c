"""Triton's ``config.pbtxt``: parsed with the vendored ``model_config.proto``, mapped onto Lantern.

`parse_config_text` reads the protobuf text format into ``inference.ModelConfig`` (a syntax
error becomes a `LayoutError` naming the file and line). `map_config` turns a config into what the
rest of Lantern already understands, a model-config.yaml-shaped dict (`ModelSettings` keys,
``metadata`` for the tensor path, ``versionPolicy``, ``warmup``, ``parameters``), plus the names of
the fields Lantern does not honour, which the server reports in one line per model.

Mapping (Triton → Lantern):

- ``max_batch_size``: ``metadata.maxBatchSize``; inputs and outputs get a leading ``-1``
  dimension when it is above 0, and the tensor path refuses larger requests with Triton's error.
- ``dynamic_batching``: ``batchSize`` (the largest ``preferred_batch_size``, else
  ``max_batch_size``) and ``maxBatchDelay`` (``max_queue_delay_microseconds``, rounded up to ms).
  Without it requests are not batched together (``batchSize`` 1), as in Triton.
- ``instance_group``: ``minWorkers``/``maxWorkers`` (the sum of ``count``, times the GPUs listed),
  ``deviceType`` (``KIND_CPU`` → cpu, ``KIND_GPU`` → gpu) and ``deviceIds`` (``gpus``).
- ``version_policy``: ``versionPolicy`` (latest n / all / specific).
- ``input``/``output``: ``metadata.inputs``/``outputs`` (name, datatype, dims, ``reshape``);
  ``label_filename`` is kept for the classification extension.
- ``model_warmup``: ``tritonWarmup``, samples of zeros or random data (``zero_data``,
  ``random_data``) each worker runs through the tensor path before it takes traffic
  (``serve/worker/warmup.py``); ``input_data_file`` is not honoured.
- ``parameters``: ``parameters`` (string values, as Triton passes them to backends).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from google.protobuf import json_format, text_format

from archiver.errors import ArchiveError
from serve.grpc.gen import model_config_pb2 as mc

CONFIG_FILE = "config.pbtxt"
# The model-config key that keeps the parsed config (as Triton's JSON) for the config API.
TRITON_CONFIG = "tritonConfig"

# Triton's TYPE_* names without the prefix are the OIP datatypes, except STRING (BYTES).
_DATATYPES = {
    name: ("BYTES" if name == "TYPE_STRING" else name.removeprefix("TYPE_"))
    for name in mc.DataType.keys()
    if name != "TYPE_INVALID"
}
OIP_TO_TRITON = {oip: triton for triton, oip in _DATATYPES.items()}

# The ModelConfig fields Lantern maps (the rest, when set, are reported as not honoured).
_HONOURED = frozenset(
    {
        "name",
        "platform",
        "backend",
        "runtime",
        "max_batch_size",
        "dynamic_batching",
        "instance_group",
        "version_policy",
        "input",
        "output",
        "parameters",
        "default_model_filename",
        "model_warmup",
    }
)
_DYNAMIC_HONOURED = frozenset(
    {"preferred_batch_size", "max_queue_delay_microseconds", "default_queue_policy"}
)
_QUEUE_HONOURED = frozenset({"max_queue_size", "default_timeout_microseconds"})


class LayoutError(ArchiveError):
    """A folder that is a model layout, but a broken one; the message names the file."""


@dataclass
class MappedConfig:
    """A config.pbtxt as Lantern settings, and what of it Lantern cannot honour."""

    model_config: dict[str, Any] = field(default_factory=dict)
    not_honoured: list[str] = field(default_factory=list)


def read_config(path: Path) -> mc.ModelConfig:
    """Parse the ``config.pbtxt`` at ``path``; a `LayoutError` naming it when it is malformed."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise LayoutError(f"{path}: cannot read: {exc}") from None
    return parse_config_text(text, str(path))


def parse_config_text(text: str, where: str) -> mc.ModelConfig:
    config = mc.ModelConfig()
    try:
        text_format.Parse(text, config)
    except text_format.ParseError as exc:
        raise LayoutError(f"{where}: malformed model configuration: {exc}") from None
    return config


def config_as_json(config: mc.ModelConfig) -> dict[str, Any]:
    """The config as Triton's ``GET /v2/models/{m}/config`` shows it (proto field names)."""
    return json_format.MessageToDict(config, preserving_proto_field_name=True)


def config_from_json(data: dict[str, Any], where: str) -> mc.ModelConfig:
    """A config given as JSON (a load request's override), as Triton reads it."""
    config = mc.ModelConfig()
    try:
        json_format.ParseDict(data, config)
    except json_format.ParseError as exc:
        raise LayoutError(f"{where}: malformed model configuration: {exc}") from None
    return config


def map_config(config: mc.ModelConfig, where: str) -> MappedConfig:
    """Lantern's settings for ``config`` (see the module docstring), with what is not honoured."""
    out = MappedConfig()
    settings = out.model_config
    for fd, _ in config.ListFields():
        if fd.name not in _HONOURED:
            out.not_honoured.append(fd.name)
    batching = config.max_batch_size > 0
    metadata: dict[str, Any] = {"maxBatchSize": int(config.max_batch_size)}
    if config.platform:
        metadata["platform"] = config.platform
    elif config.backend:
        metadata["platform"] = _BACKEND_PLATFORMS.get(config.backend, config.backend)
    if config.input:
        metadata["inputs"] = [_tensor(t, batching, where) for t in config.input]
    if config.output:
        metadata["outputs"] = [_tensor(t, batching, where) for t in config.output]
        labels = {t.name: t.label_filename for t in config.output if t.label_filename}
        if labels:
            metadata["labels"] = labels
    settings["metadata"] = metadata
    if config.HasField("dynamic_batching") and batching:
        _map_dynamic(config, settings, out.not_honoured)
    else:
        settings["batchSize"] = 1
    _map_instances(config, settings, out.not_honoured)
    if config.HasField("version_policy"):
        settings["versionPolicy"] = _policy(config.version_policy)
    if config.model_warmup:
        settings["tritonWarmup"] = [
            _warmup(w, batching, where, out.not_honoured) for w in config.model_warmup
        ]
    if config.parameters:
        settings["parameters"] = {k: v.string_value for k, v in config.parameters.items()}
    return out


# Triton's backends and the platform name each reports for its models.
_BACKEND_PLATFORMS = {
    "onnxruntime": "onnxruntime_onnx",
    "pytorch": "pytorch_libtorch",
    "openvino": "openvino",
    "python": "python",
}


def _tensor(tensor: mc.ModelInput | mc.ModelOutput, batching: bool, where: str) -> dict[str, Any]:
    datatype = _DATATYPES.get(mc.DataType.Name(tensor.data_type), "")
    if not tensor.name:
        raise LayoutError(f"{where}: an input or output has no name")
    dims = [int(d) for d in tensor.dims]
    spec: dict[str, Any] = {"name": tensor.name, "datatype": datatype}
    spec["shape"] = ([-1] if batching else []) + dims
    if tensor.HasField("reshape"):
        spec["reshape"] = [int(d) for d in tensor.reshape.shape]
    return spec


def _map_dynamic(config: mc.ModelConfig, settings: dict[str, Any], skipped: list[str]) -> None:
    dynamic = config.dynamic_batching
    for fd, _ in dynamic.ListFields():
        if fd.name not in _DYNAMIC_HONOURED:
            skipped.append(f"dynamic_batching.{fd.name}")
    preferred = [int(p) for p in dynamic.preferred_batch_size if p > 0]
    settings["batchSize"] = (
        min(max(preferred), config.max_batch_size) if preferred else (config.max_batch_size)
    )
    settings["maxBatchDelay"] = math.ceil(dynamic.max_queue_delay_microseconds / 1000)
    if dynamic.HasField("default_queue_policy"):
        queue = dynamic.default_queue_policy
        for fd, _ in queue.ListFields():
            if fd.name not in _QUEUE_HONOURED:
                skipped.append(f"dynamic_batching.default_queue_policy.{fd.name}")
        if queue.max_queue_size > 0:
            settings["jobQueueSize"] = int(queue.max_queue_size)
        if queue.default_timeout_microseconds > 0:
            settings["responseTimeout"] = queue.default_timeout_microseconds / 1_000_000


def _map_instances(config: mc.ModelConfig, settings: dict[str, Any], skipped: list[str]) -> None:
    if not config.instance_group:
        return
    count = 0
    kinds = set()
    gpus: list[int] = []
    for group in config.instance_group:
        n = group.count if group.count > 0 else 1
        kind = mc.ModelInstanceGroup.Kind.Name(group.kind)
        kinds.add(kind)
        if kind in ("KIND_GPU", "KIND_AUTO") and group.gpus:
            count += n * len(group.gpus)
            gpus.extend(int(g) for g in group.gpus if int(g) not in gpus)
        else:
            count += n
        for fd, _ in group.ListFields():
            if fd.name not in ("name", "kind", "count", "gpus"):
                skipped.append(f"instance_group.{fd.name}")
    settings["minWorkers"] = count
    settings["maxWorkers"] = count
    if kinds == {"KIND_CPU"}:
        settings["deviceType"] = "cpu"
    elif kinds == {"KIND_GPU"}:
        settings["deviceType"] = "gpu"
    if gpus:
        settings["deviceIds"] = gpus


def _policy(policy: mc.ModelVersionPolicy) -> dict[str, Any] | str:
    which = policy.WhichOneof("policy_choice")
    if which == "all":
        return "all"
    if which == "specific":
        return {"specific": [str(v) for v in policy.specific.versions]}
    return {"latest": max(1, int(policy.latest.num_versions))}


def _warmup(
    warmup: mc.ModelWarmup, batching: bool, where: str, skipped: list[str]
) -> dict[str, Any]:
    """One warm-up request: ``{"name", "inputs": {name: {"datatype", "shape", "random"}}}``."""
    inputs: dict[str, Any] = {}
    for name, spec in warmup.inputs.items():
        datatype = _DATATYPES.get(mc.DataType.Name(spec.data_type), "")
        if not datatype:
            raise LayoutError(f"{where}: model_warmup {warmup.name!r} input {name!r} has no type")
        source = spec.WhichOneof("input_data_type")
        if source == "input_data_file":
            skipped.append("model_warmup.input_data_file")
        lead = [max(1, warmup.batch_size)] if batching else []
        inputs[name] = {
            "datatype": datatype,
            "shape": lead + [int(d) for d in spec.dims],
            "random": source == "random_data",
        }
    return {"name": warmup.name, "inputs": inputs, "count": max(1, warmup.count)}
