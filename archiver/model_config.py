"""The per-model ``model-config.yaml`` (``--config-file``): parsed safely, always to a dict."""

from __future__ import annotations

from typing import Any

import yaml

from archiver.errors import ManifestError


def parse_model_config(data: bytes | str, where: str) -> dict[str, Any]:
    """Parse model-config YAML with ``yaml.safe_load``; empty → {}; anything but a mapping fails.

    safe_load only: TorchServe's unsafe loading of this file was an RCE (CVE-2022-1471).
    """
    try:
        config = yaml.safe_load(data)
    except yaml.YAMLError as exc:
        raise ManifestError(f"{where}: invalid YAML: {_describe(exc)}") from None
    if config is None:
        return {}
    if not isinstance(config, dict):
        raise ManifestError(f"{where}: model config must be a YAML mapping, not {_kind(config)}")
    return config


def _describe(exc: yaml.YAMLError) -> str:
    # PyYAML's str() spans several lines; the CLI promises one-line errors.
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        mark = exc.problem_mark
        return f"{exc.problem} (line {mark.line + 1}, column {mark.column + 1})"
    return " ".join(str(exc).split())


def _kind(value: object) -> str:
    return "a list" if isinstance(value, list) else f"a {type(value).__name__}"
