"""The workflow spec file (YAML): global and per-model settings, and the ``dag`` section.

Parsed as TorchServe 0.12's ``WorkFlow`` reads it: under ``models``, the keys ``min-workers``,
``max-workers``, ``batch-size``, ``max-batch-delay``, ``retry-attempts`` and ``timeout-ms`` are
globals and every other key is a model (``url`` plus overrides). A ``dag`` node that is not a
model is a function in the workflow's handler file.

A spec comes from a client's archive, so it is read with bounds (`SpecLimits`): at most
``MAX_SPEC_BYTES``, no YAML anchors or aliases (an alias bomb expands a few hundred bytes into
gigabytes; TorchServe's specs never use them), nesting at most ``MAX_DEPTH`` deep, node names
strings of at most ``MAX_NODE_NAME`` model-name characters, and the node and edge counts capped
(``workflow_max_nodes``, ``workflow_max_edges``). Every refusal is a short 400.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from serve.identifiers import shown as cut
from serve.wire.errors import BadRequest

MAX_SPEC_BYTES = 1024 * 1024  # TorchServe's example specs are a few hundred bytes
MAX_DEPTH = 16  # a spec is three levels deep: models -> model -> setting
MAX_NODE_NAME = 100  # characters; the node's model is "<workflow>__<node>"
_NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]*")

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
class SpecLimits:
    """How large a spec may be (``workflow_max_nodes``, ``workflow_max_edges``)."""

    max_nodes: int = 100
    max_edges: int = 1000


class _BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader that refuses anchors and aliases, and nesting past `MAX_DEPTH`."""

    _depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
            raise InvalidWorkflowSpec(
                "YAML anchors and aliases ('&', '*', '<<') are not allowed in a workflow spec."
            )
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise InvalidWorkflowSpec(
                    f"The workflow spec is nested more than {MAX_DEPTH} deep."
                )
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def shown(value: Any, limit: int = 40) -> str:
    """``repr(value)`` for a message, cut to ``limit`` characters with an ellipsis."""
    return cut(repr(value), limit)


def node_name(value: Any, where: str) -> str:
    """``value`` as a node name; raises `InvalidWorkflowSpec` unless it is a sane string."""
    if not isinstance(value, str):
        raise InvalidWorkflowSpec(f"{where}: node names must be strings, got {shown(value)}.")
    name = value.strip()
    if len(name) > MAX_NODE_NAME or not _NODE_NAME.fullmatch(name):
        raise InvalidWorkflowSpec(
            f"{where}: invalid node name {shown(value)}: use at most {MAX_NODE_NAME} letters, "
            "digits, '_', '-' and '.', starting with a letter or digit."
        )
    return name


def load_yaml(text: str | bytes) -> Any:
    """The spec's YAML, bounded as the module says; raises `InvalidWorkflowSpec`."""
    if len(text) > MAX_SPEC_BYTES:
        raise InvalidWorkflowSpec(f"The workflow spec is larger than {MAX_SPEC_BYTES} bytes.")
    loader = _BoundedLoader(text)
    try:
        return loader.get_single_data()
    except yaml.YAMLError as exc:
        raise InvalidWorkflowSpec(f"Failed to parse yaml: {cut(str(exc), 300)}") from None
    finally:
        loader.dispose()


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


def parse_spec(text: str | bytes, limits: SpecLimits | None = None) -> WorkflowSpec:
    """Parse spec file content; raises `InvalidWorkflowSpec` naming what is wrong."""
    limits = limits or SpecLimits()
    data = load_yaml(text)
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
    for key, entry in models_section.items():
        if key in SETTING_KEYS:
            continue
        name = node_name(key, "models")
        if not isinstance(entry, dict) or not isinstance(entry.get("url"), str):
            raise InvalidWorkflowSpec(f"Model {shown(name)} in the spec needs a 'url'.")
        overrides = {
            SETTING_KEYS[k]: _int(v, k, name) for k, v in entry.items() if k in SETTING_KEYS
        }
        models[name] = (entry["url"], dataclasses.replace(defaults, **overrides))
    edges = _edges(dag_section, limits)
    return WorkflowSpec(defaults, models, edges, dag_text(dag_section))


def _edges(dag_section: Mapping[Any, Any], limits: SpecLimits) -> dict[str, tuple[str, ...]]:
    """``node -> children`` from the dag section, counted against ``limits`` as they come."""
    edges: dict[str, tuple[str, ...]] = {}
    nodes: set[str] = set()
    count = 0
    for key, children in dag_section.items():
        node = node_name(key, "dag")
        if children is None:
            children = []
        if not isinstance(children, list):
            raise InvalidWorkflowSpec(f"dag node {shown(node)}: children must be a list.")
        count += len(children)
        if count > limits.max_edges:
            raise InvalidWorkflowSpec(
                f"The dag has more than {limits.max_edges} edges (workflow_max_edges)."
            )
        kids = tuple(node_name(c, f"dag node {shown(node)}") for c in children if c)
        edges[node] = kids
        nodes.add(node)
        nodes.update(kids)
        if len(nodes) > limits.max_nodes:
            raise InvalidWorkflowSpec(
                f"The dag has more than {limits.max_nodes} nodes (workflow_max_nodes)."
            )
    return edges


def dag_text(dag: Mapping[str, Any]) -> str:
    """The dag the way TorchServe's describe prints it (Java's ``Map.toString``)."""
    parts = []
    for node, children in dag.items():
        listed = "null" if children is None else "[" + ", ".join(str(c) for c in children) + "]"
        parts.append(f"{node}={listed}")
    return "{" + ", ".join(parts) + "}"


def _int(value: Any, key: str, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidWorkflowSpec(f"{where}: '{key}' must be an integer, got {shown(value)}.")
    if value < 0:
        raise InvalidWorkflowSpec(f"{where}: '{key}' cannot be negative.")
    return value
