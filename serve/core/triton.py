"""Triton's extensions over the one registry, protocol-free: model configuration, repository
index, load and unload, statistics.

Each returns plain JSON-ready data in Triton's shapes (field names as its protobuf messages); the
HTTP routes (``serve/http/triton.py``) answer them as JSON and gRPC (``serve/grpc/triton.py``)
parses them into Triton's messages. Load and unload are the management API's register and
unregister (the same ``enable_model_api`` switch, ``--model-control-mode``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from archiver import ArchiveError
from serve.config import Config
from serve.core.manage import require_model_api
from serve.core.model import ModelVersion
from serve.core.observer import VersionTally
from serve.core.registry import Registry
from serve.store.layouts import ARCHIVE_SUFFIXES, MODEL_FILES, NotAModel, recognise, scan_store
from serve.store.triton_config import OIP_TO_TRITON, TRITON_CONFIG, config_from_json
from serve.store.version_policy import sort_versions
from serve.wire.errors import BadRequest, MethodNotAllowed, ModelNotFound

POLL_REFUSED = "explicit model load / unload is not allowed if polling is enabled"


# ----- model configuration ---------------------------------------------------------------------


def model_config(model: ModelVersion, metadata: dict[str, Any]) -> dict[str, Any]:
    """The model's configuration: its parsed config.pbtxt (or load override), completed from what
    the model and Lantern's settings say where it is silent (Triton's auto-complete); for an
    archive, all of it synthesised that way. Normalised through Triton's ModelConfig message."""
    config: dict[str, Any] = dict(model.source.model_config.get(TRITON_CONFIG) or {})
    declared = model.source.model_config.get("metadata")
    declared = declared if isinstance(declared, dict) else {}
    settings = model.settings
    inputs = list(metadata.get("inputs") or [])
    outputs = list(metadata.get("outputs") or [])
    config.setdefault("name", model.name)
    platform = str(metadata.get("platform") or "")
    if platform and "backend" not in config:
        config.setdefault("platform", platform)
    if "max_batch_size" not in config:
        if "maxBatchSize" in declared:
            config["max_batch_size"] = int(declared["maxBatchSize"] or 0)
        else:  # a model that takes a batch dimension, batched up to batchSize
            leading = bool(inputs) and all(_leading_batch(t) for t in inputs)
            config["max_batch_size"] = settings.batch_size if leading else 0
    batching = int(config["max_batch_size"]) > 0
    if "input" not in config and inputs:
        config["input"] = [_tensor_config(t, batching) for t in inputs]
    if "output" not in config and outputs:
        config["output"] = [_tensor_config(t, batching) for t in outputs]
    if "dynamic_batching" not in config and batching and settings.batch_size > 1:
        config["dynamic_batching"] = {
            "max_queue_delay_microseconds": settings.max_batch_delay * 1000,
        }
    if "instance_group" not in config:
        kind = "KIND_GPU" if settings.device_type == "gpu" else "KIND_CPU"
        group: dict[str, Any] = {"count": model.min_workers, "kind": kind}
        if settings.device_ids:
            group["gpus"] = list(settings.device_ids)
        config["instance_group"] = [group]
    config.setdefault("version_policy", {"latest": {"num_versions": 1}})
    # Through the message and back: unknown keys refused, numbers in Triton's JSON form.
    from serve.store.triton_config import config_as_json

    return config_as_json(config_from_json(config, f"model {model.name}"))


def _leading_batch(tensor: dict[str, Any]) -> bool:
    shape = tensor.get("shape") or []
    return bool(shape) and int(shape[0]) == -1


def _tensor_config(tensor: dict[str, Any], batching: bool) -> dict[str, Any]:
    shape = [int(d) for d in tensor.get("shape") or []]
    dims = shape[1:] if batching and shape else shape
    entry: dict[str, Any] = {"name": str(tensor.get("name", "")), "dims": dims}
    datatype = OIP_TO_TRITON.get(str(tensor.get("datatype", "")))
    if datatype:
        entry["data_type"] = datatype
    return entry


# ----- labels for the classification extension -------------------------------------------------

_LABELS: dict[Path, list[str]] = {}  # label file -> its lines, read once


def output_labels(model: ModelVersion) -> dict[str, list[str]]:
    """Each output's class names, from config.pbtxt's ``label_filename`` (one name a line)."""
    metadata = model.source.model_config.get("metadata")
    named = metadata.get("labels") if isinstance(metadata, dict) else None
    if not isinstance(named, dict) or not named:
        return {}
    labels = {}
    for output, filename in named.items():
        path = model.source.model_dir / Path(str(filename)).name
        lines = _LABELS.get(path)
        if lines is None:
            try:
                text = path.read_text(encoding="utf-8", errors="replace")
            except OSError:
                text = ""
            lines = _LABELS[path] = text.splitlines()
        labels[str(output)] = lines
    return labels


# ----- repository index ------------------------------------------------------------------------


async def repository_index(registry: Registry, ready_only: bool) -> list[dict[str, Any]]:
    """Every model in the store (loaded or not) and every registered version, with its state.
    The store is read in a thread; the registry on the loop that owns it."""
    rows: list[dict[str, Any]] = []
    listed: set[str] = set()
    for name, entry in sorted(registry.models.items()):
        listed.add(name)
        for version in sort_versions(entry.versions):
            model = entry.versions[version]
            error = model.load_error()
            if model.ready_workers() > 0:
                state, reason = "READY", ""
            elif error:
                state, reason = "UNAVAILABLE", error
            else:
                state, reason = "LOADING", ""
            rows.append({"name": name, "version": version, "state": state, "reason": reason})
    for name, reason in await asyncio.to_thread(_store_models, registry.config.model_store):
        if name not in listed:
            rows.append({"name": name, "version": "", "state": "UNAVAILABLE", "reason": reason})
    if ready_only:
        rows = [r for r in rows if r["state"] == "READY"]
    return rows


def _store_models(store: str | None) -> list[tuple[str, str]]:
    if not store:
        return []
    found = []
    for entry in scan_store(Path(store)).models:
        try:
            found.append((recognise(Path(store) / entry).name, "unloaded"))
        except ArchiveError as exc:
            found.append((_stem(entry), str(exc).rsplit(": ", 1)[-1]))
    return found


def _stem(entry: str) -> str:
    for suffix in (*ARCHIVE_SUFFIXES, *(m.suffix for m in MODEL_FILES)):
        if entry.endswith(suffix):
            return entry[: -len(suffix)]
    return entry


# ----- load and unload -------------------------------------------------------------------------


def check_model_control(config: Config) -> None:
    """Load and unload need the model API on (off by default, as with Triton's ``none``), and
    are refused while the store is polled."""
    if config.model_control_mode == "poll":
        raise MethodNotAllowed(POLL_REFUSED)
    require_model_api(config)


async def load(
    registry: Registry, name: str, config_override: dict[str, Any] | None
) -> ModelVersion:
    """Load (or reload) the store's model ``name``, optionally with another configuration."""
    check_model_control(registry.config)
    url = await asyncio.to_thread(_store_entry, registry, name)
    if name in registry.models:
        await registry.unregister_all(name)
    return await registry.register(
        url,
        model_name=name,
        synchronous=True,
        config_override=config_override,
    )  # workers as at startup: config.pbtxt's instance_group, else the server's default


async def unload(registry: Registry, name: str) -> None:
    check_model_control(registry.config)
    if name not in registry.models:
        raise ModelNotFound(f"failed to unload '{name}', no version is available")
    await registry.unregister_all(name)


def _store_entry(registry: Registry, name: str) -> str:
    store = registry.config.model_store
    if not store:
        raise BadRequest("No model store is configured; start the server with --model-store.")
    root = Path(store)
    suffixes = ("", *ARCHIVE_SUFFIXES, *(m.suffix for m in MODEL_FILES))
    for suffix in suffixes:
        candidate = root / f"{name}{suffix}"
        if candidate.exists():
            return candidate.name
    for entry in scan_store(root).models:
        try:
            if recognise(root / entry).name == name:
                return entry
        except (NotAModel, ArchiveError):
            continue
    raise ModelNotFound(f"failed to load '{name}', failed to poll from model repository")


# ----- statistics ------------------------------------------------------------------------------


def statistics(
    registry: Registry,
    tallies: Mapping[tuple[str, str], VersionTally],
    name: str | None,
    version: str | None,
) -> list[dict[str, Any]]:
    """Triton's ``model_stats``: one entry per version, from the counts the metrics keep
    (``ServerMetrics.tallies``, by model and version)."""
    if name is None:
        versions = registry.all_versions()
    elif version:
        versions = [registry.get(name, version)]
    else:
        versions = registry.versions(name)
    return [_stats(m, tallies.get((m.name, m.version))) for m in versions]


def _stats(model: ModelVersion, tally: VersionTally | None) -> dict[str, Any]:
    tally = tally or VersionTally()

    def duration(count: int, seconds: float) -> dict[str, int]:
        return {"count": count, "ns": int(seconds * 1e9)}

    return {
        "name": model.name,
        "version": model.version,
        "last_inference": int(tally.last_inference * 1000),
        "inference_count": tally.inferences,
        "execution_count": tally.executions,
        "inference_stats": {
            "success": duration(tally.success, tally.success_seconds),
            "fail": duration(tally.fail, tally.fail_seconds),
            "queue": duration(tally.inferences, tally.queue_seconds),
            "compute_input": duration(0, 0.0),
            "compute_infer": duration(0, 0.0),
            "compute_output": duration(0, 0.0),
            "cache_hit": duration(0, 0.0),
            "cache_miss": duration(0, 0.0),
        },
        "batch_stats": [],
    }
