"""``serve kserve``: Lantern as the container of a KServe ``ServingRuntime`` (the pod contract).

KServe's storage initializer puts the model under ``/mnt/models`` (read-only; its entries may be
symlinks to the real files) and starts the runtime container with arguments such as
``--model_name={{.Name}} --model_dir=/mnt/models`` and a ``PORT``. This module turns that into a
Lantern configuration:

- **where the models are** (`plan_models`): TorchServe's KServe layout (``config/config.properties``
  plus ``model-store/*.mar``), one or more archives (``.mar``, ``.tar.gz``, unpacked folders) at the
  top of the folder, or the folder itself being an unpacked archive (``MAR-INF/MANIFEST.json``);
- **which ports** (`pod_overrides`): KServe v1, Open Inference Protocol v2 and TorchServe's routes
  together on ``PORT`` (default 8080), gRPC on the runtime's gRPC port (default 8081), metrics on
  their own port (default 8082), management on loopback only (default 8085). None of Knative's
  reserved ports is accepted.

Everything else is the ordinary server: the same registry, batcher and workers as ``serve start``.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from serve.config import ConfigError, read_properties

DEFAULT_MODEL_DIR = Path("/mnt/models")
DEFAULT_HTTP_PORT = 8080
DEFAULT_GRPC_PORT = 8081
DEFAULT_METRICS_PORT = 8082
DEFAULT_MANAGEMENT_PORT = 8085
# Ports the Knative queue-proxy and its metrics use in every pod: a runtime must not take them.
KNATIVE_RESERVED_PORTS = frozenset({8012, 8013, 8022, 9090, 9091})

_ARCHIVE_SUFFIXES = (".mar", ".tar.gz", ".tgz", ".zip")
_MANIFEST = Path("MAR-INF") / "MANIFEST.json"


class PodContractError(ConfigError):
    """The pod's model folder or ports cannot be served; the message says what to change."""


@dataclass(frozen=True)
class ModelPlan:
    """What to serve from the model folder, as server settings."""

    layout: str  # "torchserve", "store" or "folder": how the model folder was read
    model_store: Path
    ts_config: Path | None = None
    load_models: list[str] = field(default_factory=list)  # ``name=url`` entries
    # Archives reached through symlinks lie outside the store; each is allowed by its exact path.
    allowed_urls: list[str] = field(default_factory=list)


def plan_models(model_dir: Path, model_name: str | None = None) -> ModelPlan:
    """Read the model folder the way KServe fills it; raises `PodContractError` when it holds no
    model. ``model_name`` (the InferenceService's name) names a single archive; with TorchServe's
    layout the models and their names are the ones ``config.properties`` gives."""
    if not model_dir.exists():
        raise PodContractError(f"Model folder {model_dir} does not exist")
    if model_dir.is_file():
        return _plan_archives(model_dir.parent, [model_dir], model_name)
    config = model_dir / "config" / "config.properties"
    if config.is_file():
        return _plan_torchserve(model_dir, config, model_name)
    if (model_dir / _MANIFEST).is_file():
        folder = model_dir.resolve()
        name = model_name or _manifest_name(folder) or folder.name
        return ModelPlan("folder", folder.parent, load_models=[f"{name}={folder.name}"])
    archives = _archives_in(model_dir)
    if not archives:
        raise PodContractError(
            f"No model in {model_dir}: expected config/config.properties with a model-store "
            "folder (TorchServe's KServe layout), model archives (.mar, .tar.gz), or an "
            "unpacked archive (MAR-INF/MANIFEST.json)"
        )
    return _plan_archives(model_dir, archives, model_name)


def _plan_torchserve(model_dir: Path, config: Path, model_name: str | None) -> ModelPlan:
    store = model_dir / "model-store"
    if not store.is_dir():
        raise PodContractError(
            f"{config} is there but {store} is not: TorchServe's KServe layout keeps the "
            "archives in model-store/"
        )
    settings = read_properties(config)
    if settings.get("load_models") or settings.get("model_snapshot"):
        return ModelPlan("torchserve", store.resolve(), ts_config=config)
    plan = _plan_archives(store, _archives_in(store), model_name)
    return ModelPlan(
        "torchserve",
        plan.model_store,
        ts_config=config,
        load_models=plan.load_models,
        allowed_urls=plan.allowed_urls,
    )


def _plan_archives(store: Path, archives: list[Path], model_name: str | None) -> ModelPlan:
    if not archives:
        raise PodContractError(f"No model archive in {store}")
    resolved_store = store.resolve()
    load: list[str] = []
    allowed: list[str] = []
    for archive in archives:
        target = archive.resolve()
        if target.parent == resolved_store:
            url = target.name
        else:  # a symlink from the storage initializer: allow that one path, nothing more
            url = str(target)
            allowed.append(re.escape(url))
        name = model_name if model_name and len(archives) == 1 else _archive_name(target)
        load.append(f"{name}={url}")
    return ModelPlan("store", resolved_store, load_models=load, allowed_urls=allowed)


def _archives_in(folder: Path) -> list[Path]:
    found = []
    for entry in sorted(folder.iterdir()):
        if entry.name.startswith("."):
            continue
        if entry.is_file() and entry.name.lower().endswith(_ARCHIVE_SUFFIXES):
            found.append(entry)
        elif entry.is_dir() and (entry / _MANIFEST).is_file():
            found.append(entry)
    return found


def _archive_name(path: Path) -> str:
    if path.is_dir():
        return _manifest_name(path) or path.name
    name = path.name
    for suffix in _ARCHIVE_SUFFIXES:
        if name.lower().endswith(suffix):
            return name[: -len(suffix)]
    return name


def _manifest_name(folder: Path) -> str | None:
    try:
        manifest = json.loads((folder / _MANIFEST).read_text())
        return manifest["model"]["modelName"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def port_from(value: str | int | None, default: int, what: str) -> int:
    """A port number from an argument or the environment; refuses Knative's reserved ports."""
    if value is None or value == "":
        return default
    try:
        port = int(value)
    except ValueError:
        raise PodContractError(f"{what} must be a port number, not {value!r}") from None
    if not 0 <= port <= 65535:
        raise PodContractError(f"{what} {port} is not a port number")
    if port in KNATIVE_RESERVED_PORTS:
        raise PodContractError(
            f"{what} {port} is reserved by Knative's queue-proxy "
            f"({', '.join(map(str, sorted(KNATIVE_RESERVED_PORTS)))}); pick another"
        )
    return port


def pod_overrides(
    plan: ModelPlan,
    env: Mapping[str, str],
    *,
    http_port: int | None = None,
    grpc_port: int | None = None,
    host: str | None = None,
    known_settings: frozenset[str] = frozenset(),
) -> dict[str, Any]:
    """Server settings for the pod: ports from arguments or ``PORT``, the plan's models, no
    snapshots (``/mnt/models`` is read-only and a pod starts from its spec), no token auth unless
    the config or the environment turns it on (KServe authenticates at its ingress)."""
    bind = host or env.get("LANTERN_KSERVE_HOST") or "0.0.0.0"
    http = http_port if http_port is not None else port_from(env.get("PORT"), 8080, "PORT")
    metrics = port_from(env.get("METRICS_PORT"), DEFAULT_METRICS_PORT, "METRICS_PORT")
    management = port_from(env.get("MANAGEMENT_PORT"), DEFAULT_MANAGEMENT_PORT, "MANAGEMENT_PORT")
    values: dict[str, Any] = {
        "model_store": str(plan.model_store),
        "inference_address": f"http://{bind}:{http}",
        "snapshot": False,
    }
    # An address the operator set in the environment (LANTERN_METRICS_ADDRESS, ...) wins.
    if "LANTERN_METRICS_ADDRESS" not in env:
        values["metrics_address"] = f"http://{bind}:{metrics}"
    if "LANTERN_MANAGEMENT_ADDRESS" not in env:
        values["management_address"] = f"http://127.0.0.1:{management}"
    if plan.load_models:
        values["load_models"] = list(plan.load_models)
    if plan.allowed_urls:
        from_config = read_properties(plan.ts_config) if plan.ts_config else {}
        values["allowed_urls"] = [*from_config.get("allowed_urls", []), *plan.allowed_urls]
    token_set = "LANTERN_DISABLE_TOKEN_AUTHORIZATION" in env or (
        plan.ts_config is not None
        and "disable_token_authorization" in read_properties(plan.ts_config)
    )
    if not token_set:
        values["disable_token_authorization"] = True
    grpc = (
        grpc_port
        if grpc_port is not None
        else port_from(env.get("GRPC_PORT"), DEFAULT_GRPC_PORT, "GRPC_PORT")
    )
    if "grpc_inference_port" in known_settings:
        values["grpc_inference_port"] = grpc
        if "grpc_inference_address" in known_settings:
            values["grpc_inference_address"] = bind
    return values


def model_dir_from(value: str | None, env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    return Path(value or env.get("MODEL_DIR") or DEFAULT_MODEL_DIR)
