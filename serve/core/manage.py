"""Management operations shared by the HTTP management API and its gRPC twin.

Each takes plain parameters, goes through the `Registry` and returns what both protocols answer:
a `Reply` (TorchServe's ``{"status": ...}`` message and its HTTP status) or the JSON-ready data of
a listing or description. HTTP wraps them in JSON responses (``serve/http/management.py``); gRPC
puts the same text in ``ManagementResponse.msg`` (``serve/grpc/management.py``).
"""

from __future__ import annotations

import uuid
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from serve.config import Config
from serve.core.describe import describe_model, failed_versions
from serve.core.model import ModelVersion
from serve.core.params import parse_bool, parse_int
from serve.core.registry import Registry
from serve.wire.errors import BadRequest, MethodNotAllowed, error_for_status

MODEL_API_OFF = (
    "Requested method is not allowed, please refer to API document. "
    "Registering and unregistering models is off: start the server with --enable-model-api."
)
IN_PROGRESS = "Workers scaling in progress..."
ACCEPTED = "Processing worker updates..."
# Register parameters that are model settings: (parameter, ModelSettings attribute, minimum).
_SETTINGS = (
    ("batch_size", "batch_size", 1),
    ("max_batch_delay", "max_batch_delay", 0),
    ("response_timeout", "response_timeout", 1),
    ("startup_timeout", "startup_timeout", 1),
)


@dataclass(frozen=True)
class Reply:
    """A status message and the HTTP status it is answered with."""

    message: str
    status: int = 200


def require_model_api(config: Config) -> None:
    if not config.enable_model_api:
        raise MethodNotAllowed(MODEL_API_OFF)


def list_models(
    registry: Registry,
    limit: int | None,
    next_page_token: int | None,
    hidden: Collection[str] = (),
) -> Any:
    """One page of ``{"nextPageToken"?, "models": [...]}``, as TorchServe's ApiUtils.getModelList.

    Out-of-range values fall back, they do not fail. ``hidden`` names are left out: workflows'
    function nodes, which TorchServe does not list either (their model nodes are listed).
    """
    if limit is None or limit <= 0 or limit > 100:  # 0 too: a page of nothing would never advance
        limit = 100
    offset = max(next_page_token or 0, 0)
    names = sorted(n for n in registry.models if n not in hidden)
    body: dict[str, Any] = {}
    if offset + limit < len(names):
        body["nextPageToken"] = str(offset + limit)
    body["models"] = [
        {"modelName": n, "modelUrl": registry.models[n].default.source.url}
        for n in names[offset : offset + limit]
    ]
    return body


async def register_model(
    registry: Registry, config: Config, params: Mapping[str, Any], *, synchronous_default: bool
) -> Reply:
    """Register from TorchServe's register parameters (strings, numbers or booleans)."""
    require_model_api(config)
    url = text_param(params.get("url"))
    if not url:
        raise BadRequest("Parameter url is required.")
    settings: dict[str, Any] = {}
    for param, key, minimum in _SETTINGS:
        value = _optional_int(params, param, minimum)
        if value is not None:
            settings[key] = value
    workers = _optional_int(params, "initial_workers", 0)
    synchronous = parse_bool(text_param(params.get("synchronous")) or None, synchronous_default)
    model = await registry.register(
        url,
        model_name=text_param(params.get("model_name")) or None,
        handler=text_param(params.get("handler")) or None,
        runtime=text_param(params.get("runtime")) or None,
        initial_workers=workers,
        synchronous=synchronous,
        settings=settings,
        fallback_workers=config.default_workers_per_model,
    )
    requested = model.min_workers
    if requested == 0:
        return Reply(
            f'Model "{model.name}" Version: {model.version} registered with 0 initial workers.'
            " Use scale workers API to add workers for the model."
        )
    done = (
        f'Model "{model.name}" Version: {model.version} registered with {requested} initial workers'
    )
    return _progress(model, requested, synchronous, done)


async def describe(
    registry: Registry, name: str, version: str | None, *, customized: bool
) -> list[dict[str, Any]]:
    """The describe objects of one version, or of every version for ``all``."""
    failures = failed_versions(registry.failures.get(name, {}))
    if version == "all":  # TorchServe ignores customized=true here too
        return [describe_model(m) | failures for m in registry.versions(name)]
    model = registry.get(name, version)
    data = describe_model(model) | failures
    if customized:
        data["customizedMetadata"] = await _customized(model)
    return [data]


async def scale(
    registry: Registry,
    name: str,
    version: str | None,
    min_worker: int,
    max_worker: int | None,
    *,
    synchronous: bool,
) -> Reply:
    model = await registry.scale(name, version, min_worker, max_worker, synchronous=synchronous)
    done = f"Workers scaled to {min_worker} for model: {model.name}, version: {model.version}"
    return _progress(model, min_worker, synchronous, done)


def _progress(model: ModelVersion, wanted: int, synchronous: bool, done: str) -> Reply:
    """TorchServe's answer to a call that starts workers: accepted (202) when asynchronous,
    partial (206) while fewer than ``wanted`` are ready, else ``done``."""
    if not synchronous:
        return Reply(ACCEPTED, 202)
    if model.ready_workers() < wanted:
        return Reply(IN_PROGRESS, 206)
    return Reply(done)


async def unregister(registry: Registry, config: Config, name: str, version: str | None) -> Reply:
    require_model_api(config)
    model = await registry.unregister(name, version)
    return Reply(f'Model "{model.name}" unregistered')


async def set_default(registry: Registry, name: str, version: str) -> Reply:
    """Make ``version`` the default once its workers are warm (the watcher's swap, too)."""
    model = await registry.swap_default(name, version)
    return Reply(f'Default version successfully updated for model "{name}" to "{model.version}"')


def _optional_int(params: Mapping[str, Any], name: str, minimum: int) -> int | None:
    """An integer parameter, or None when absent; -1 means absent, as TorchServe's defaults do."""
    raw = params.get(name)
    if isinstance(raw, bool) or isinstance(raw, float) and not raw.is_integer():
        raise BadRequest(f"Parameter {name} must be an integer, got {raw!r}")
    value = parse_int(params, name)
    if value is None or value == -1:
        return None
    if value < minimum:
        raise BadRequest(f"Parameter {name} must be at least {minimum}, got {value}")
    return value


def text_param(value: Any) -> str:
    """A parameter as stripped text (booleans as TorchServe spells them; None as empty)."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value).strip()


async def _customized(model: ModelVersion) -> str:
    """Run the handler's ``describe_handle`` on a worker; its output, as text (TorchServe's shape).

    Like TorchServe, a model with no worker answers 503 and a failing handler its error.
    """
    from serve.core.jobs import BatchItem

    item = BatchItem(str(uuid.uuid4()), {"describe": "True"}, [("body", None, b"")])
    result = await model.submit(item)
    if result.status >= 400:
        raise error_for_status(result.status, result.body.decode(errors="replace"))
    return result.body.decode(errors="replace")
