"""The workflow spec file (YAML): global and per-model settings, and the ``dag`` section.

Parsed as TorchServe 0.12's ``WorkFlow`` reads it: under ``models``, the keys ``min-workers``,
``max-workers``, ``batch-size``, ``max-batch-delay``, ``retry-attempts`` and ``timeout-ms`` are
globals and every other key is a model (``url`` plus overrides). A ``dag`` node that is not a
model is a function in the workflow's handler file.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from serve.wire.errors import BadRequest

# Spec key -> NodeSettings attribute.
SETTING_KEYS = {
    "min-workers": "min_workers",
    "max-workers": "max_workers",
    "batch-size": "batch_size",
    "max-batch-delay": "max_batch_delay",
    "retry-attempts": "retry_attempts",
    "timeout-ms": "timeout_ms",
}


class InvalidWorkflowSpec(BadRequest):
    """The spec file is not YAML, or its ``models``/``dag`` sections are malformed."""

    error_type = "InvalidWorkflowException"


@dataclass(frozen=True)
class NodeSettings:
    """How one node is served and called; TorchServe's defaults."""

    min_workers: int = 1
    max_workers: int = 1
    batch_size: int = 1
    max_batch_delay: int = 50  # ms
    retry_attempts: int = 1  # retries after the first attempt
    timeout_ms: int = 10000  # per attempt


@dataclass(frozen=True)
class WorkflowSpec:
    """A parsed spec: the global settings, the models (url, settings) and the dag edges."""

    defaults: NodeSettings
    models: dict[str, tuple[str, NodeSettings]]
    edges: dict[str, tuple[str, ...]]
    dag_text: str  # the dag as TorchServe's describe shows it: "{a=[b, c], b=[d]}"

    def is_model(self, node: str) -> bool:
        return node in self.models

    def settings(self, node: str) -> NodeSettings:
        """A model's own settings; a function node gets one worker, batch 1, no delay."""
        if node in self.models:
            return self.models[node][1]
        return dataclasses.replace(
            self.defaults, min_workers=1, max_workers=1, batch_size=1, max_batch_delay=0
        )


def parse_spec(text: str | bytes) -> WorkflowSpec:
    """Parse spec file content; raises `InvalidWorkflowSpec` naming what is wrong."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise InvalidWorkflowSpec(f"Failed to parse yaml: {exc}") from None
    if not isinstance(data, dict):
        raise InvalidWorkflowSpec("The workflow spec must be a mapping with 'models' and 'dag'.")
    models_section = data.get("models") or {}
    if not isinstance(models_section, dict):
        raise InvalidWorkflowSpec("The spec's 'models' section must be a mapping.")
    dag_section = data.get("dag")
    if not isinstance(dag_section, dict) or not dag_section:
        raise InvalidWorkflowSpec("The spec has no 'dag' section mapping nodes to their children.")
    defaults = NodeSettings(
        **{
            SETTING_KEYS[k]: _int(v, k, "models")
            for k, v in models_section.items()
            if k in SETTING_KEYS
        }
    )
    models: dict[str, tuple[str, NodeSettings]] = {}
    for name, entry in models_section.items():
        if name in SETTING_KEYS:
            continue
        if not isinstance(entry, dict) or not isinstance(entry.get("url"), str):
            raise InvalidWorkflowSpec(f"Model {name!r} in the spec needs a 'url'.")
        overrides = {
            SETTING_KEYS[k]: _int(v, k, str(name)) for k, v in entry.items() if k in SETTING_KEYS
        }
        models[str(name)] = (entry["url"], dataclasses.replace(defaults, **overrides))
    edges: dict[str, tuple[str, ...]] = {}
    for node, children in dag_section.items():
        if children is None:
            children = []
        if not isinstance(children, list):
            raise InvalidWorkflowSpec(f"dag node {node!r}: children must be a list.")
        edges[str(node)] = tuple(str(c).strip() for c in children if c and str(c).strip())
    return WorkflowSpec(defaults, models, edges, dag_text(dag_section))


def dag_text(dag: Mapping[Any, Any]) -> str:
    """The dag the way TorchServe's describe prints it (Java's ``Map.toString``)."""
    parts = []
    for node, children in dag.items():
        shown = "null" if children is None else "[" + ", ".join(str(c) for c in children) + "]"
        parts.append(f"{node}={shown}")
    return "{" + ", ".join(parts) + "}"


def _int(value: Any, key: str, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidWorkflowSpec(f"{where}: '{key}' must be an integer, got {value!r}.")
    if value < 0:
        raise InvalidWorkflowSpec(f"{where}: '{key}' cannot be negative.")
    return value
