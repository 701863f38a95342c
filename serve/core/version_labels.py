"""TF Serving's version choice for a model: a number (0 or none: the default), or a label.

Labels are per model (``{"stable": "1", "canary": "2"}``), set by TF Serving's ``models.config``
and by ``ModelService.HandleReloadConfigRequest``; a label must name a registered version when it
is set. Both TF Serving edges (REST and gRPC) resolve through `resolve`, so they agree.
"""

from __future__ import annotations

from serve.core.model import ModelVersion
from serve.core.registry import Registry
from serve.identifiers import shown
from serve.wire.errors import BadRequest, ModelVersionNotFound
from serve.wire.tfserving import LabelNotFound, numeric_version


class VersionLabels:
    """Labels of each model's versions."""

    def __init__(self) -> None:
        self._by_model: dict[str, dict[str, str]] = {}

    def of(self, name: str) -> dict[str, str]:
        return dict(self._by_model.get(name, {}))

    def assign(self, registry: Registry, name: str, labels: dict[str, str]) -> None:
        """Replace ``name``'s labels; each must name a registered version (400 otherwise)."""
        for label, version in labels.items():
            try:
                find_version(registry, name, version)
            except ModelVersionNotFound:
                raise BadRequest(
                    f"version label {shown(label)} of model {shown(name)} names version "
                    f"{shown(version)}, which is not served"
                ) from None
        self._by_model[name] = dict(labels)


def find_version(registry: Registry, name: str, version: str | None) -> ModelVersion:
    """``version`` of ``name``: ``None``, ``""`` or ``"0"`` is the default version; a number
    matches a version of the same value (``2`` finds ``"2.0"``)."""
    if not version or version == "0":
        return registry.get(name)
    versions = {mv.version: mv for mv in registry.versions(name)}
    if version in versions:
        return versions[version]
    number = numeric_version(version)
    if number is not None:
        for text, model in versions.items():
            if numeric_version(text) == number:
                return model
    return registry.get(name, version)  # raises the registry's own 404


def resolve(
    registry: Registry,
    labels: VersionLabels,
    name: str,
    version: str | None = None,
    label: str | None = None,
) -> ModelVersion:
    """The version a TF Serving request names by number or by label."""
    if label:
        registry.get(name)  # an unknown model is a 404 before its labels are looked at
        target = labels.of(name).get(label)
        if target is None:
            raise LabelNotFound(f"Unrecognized servable version label: {shown(label)}")
        return find_version(registry, name, target)
    return find_version(registry, name, version)
