"""OpenVINO Model Server's ``config.json``: its ``model_config_list``, read into the loader's terms.

Each entry becomes an `OvmsModel`: the model's name, the folder to load (``base_path``, relative
paths taken from the config file's folder) and the settings laid over what the loader found there
(`serve.store.layouts.ModelLayout.overlay`):

- ``model_version_policy`` → ``versionPolicy`` (``{"latest": {"num_versions": N}}``, ``all``,
  ``specific``), as TF Serving and OVMS write it;
- ``target_device`` → ``openvino.device``; ``plugin_config`` → ``openvino.plugin_config``;
- ``batch_size`` (a number or ``auto``) → ``openvino.batch_size``; ``shape`` (``auto``, ``(1,3,
  224,224)`` or per input) → ``openvino.shape``: the IR is reshaped before it is compiled;
- ``nireq``, ``layout`` and the rest are named in the model's "not honoured" startup line.

`ConfigWatcher` in ``serve/server.py`` re-reads the file when it changes and loads, reloads or
unloads what changed through the registry.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from serve.store.layouts import Overlay
from serve.store.triton_config import LayoutError

_HONOURED = frozenset(
    {
        "name",
        "base_path",
        "model_version_policy",
        "target_device",
        "plugin_config",
        "batch_size",
        "shape",
    }
)


@dataclass(frozen=True)
class OvmsModel:
    """One ``model_config_list`` entry."""

    name: str
    base_path: Path
    overlay: Overlay = field(default_factory=Overlay)


def read_ovms_config(path: Path) -> list[OvmsModel]:
    """The models ``path`` lists; a `LayoutError` naming the file when it is malformed."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise LayoutError(f"{path}: cannot read the OVMS configuration: {exc}") from None
    return parse_ovms_config(data, path)


def parse_ovms_config(data: Any, path: Path) -> list[OvmsModel]:
    entries = data.get("model_config_list") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        raise LayoutError(f'{path}: no model_config_list (a list of {{"config": {{...}}}})')
    models: list[OvmsModel] = []
    for index, entry in enumerate(entries):
        config = entry.get("config") if isinstance(entry, dict) else None
        where = f"{path}: model_config_list[{index}]"
        if not isinstance(config, dict):
            raise LayoutError(f'{where} has no "config" object')
        models.append(_model(config, path.parent, where))
    names = [m.name for m in models]
    for name in names:
        if names.count(name) > 1:
            raise LayoutError(f"{path}: model {name!r} is listed more than once")
    return models


def _model(config: dict[str, Any], root: Path, where: str) -> OvmsModel:
    name = config.get("name")
    base = config.get("base_path")
    if not isinstance(name, str) or not name:
        raise LayoutError(f'{where}: "name" must be a non-empty string')
    if not isinstance(base, str) or not base:
        raise LayoutError(f'{where}: "base_path" must be a path')
    overlay: dict[str, Any] = {}
    openvino: dict[str, Any] = {}
    policy = config.get("model_version_policy")
    if policy is not None:
        overlay["versionPolicy"] = policy
    if "target_device" in config:
        openvino["device"] = str(config["target_device"])
    plugin = config.get("plugin_config")
    if plugin is not None:
        if not isinstance(plugin, dict):
            raise LayoutError(f'{where}: "plugin_config" must be an object')
        openvino["plugin_config"] = plugin
    if "batch_size" in config:
        openvino["batch_size"] = _batch(config["batch_size"], where)
    if "shape" in config:
        openvino["shape"] = _shapes(config["shape"], where)
    if openvino:
        overlay["openvino"] = openvino
    skipped = tuple(sorted(k for k in config if k not in _HONOURED))
    base_path = Path(base)
    if not base_path.is_absolute():
        base_path = root / base_path
    return OvmsModel(name, base_path, Overlay(overlay, skipped))


def _batch(value: Any, where: str) -> int | str:
    if isinstance(value, str) and value.strip().lower() == "auto":
        return "auto"
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise LayoutError(f'{where}: "batch_size" must be a number or "auto"') from None
    if number < 1:
        raise LayoutError(f'{where}: "batch_size" must be at least 1')
    return number


def _shapes(value: Any, where: str) -> str | list[int] | dict[str, Any]:
    """``auto``, one shape for every input, or ``{input: shape}``; shapes as ``(1,3,224,224)``."""
    if isinstance(value, dict):
        return {str(k): _shapes(v, where) for k, v in value.items()}
    if isinstance(value, str) and value.strip().lower() == "auto":
        return "auto"
    if isinstance(value, list):
        return [int(d) for d in value]
    if isinstance(value, str):
        text = value.strip().strip("()[]")
        try:
            return [int(d) for d in text.split(",") if d.strip()]
        except ValueError:
            pass
    raise LayoutError(f'{where}: "shape" must be "auto" or like "(1,3,224,224)"')
