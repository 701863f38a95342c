"""ModelArchive: an unpacked model folder with its manifest and model config."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from archiver.errors import ManifestError
from archiver.manifest import DEFAULT_VERSION, MANIFEST_PATH, parse_manifest
from archiver.model_config import parse_model_config
from archiver.safety import is_within

# Junk that zip tools put next to the real top folder; it must not hide TorchServe's tgz layout.
_IGNORED_TOP_ENTRIES = frozenset({"__MACOSX"})


@dataclass(frozen=True)
class ModelArchive:
    """A model folder on disk (absolute ``model_dir``), its manifest and its model config."""

    model_dir: Path
    manifest: dict[str, Any]
    model_config: dict[str, Any] = field(default_factory=dict)

    @property
    def model_name(self) -> str:
        """``model.modelName`` from the manifest."""
        return str(self.manifest["model"]["modelName"])

    @property
    def version(self) -> str:
        """``model.modelVersion``, or TorchServe's default "1.0" when the manifest has none."""
        version = self.manifest["model"].get("modelVersion")
        return DEFAULT_VERSION if version in (None, "") else str(version)

    @property
    def handler(self) -> str:
        """``model.handler``: a built-in name or ``file.py[:function]``."""
        return str(self.manifest["model"]["handler"])

    @property
    def runtime(self) -> str:
        """The manifest's ``runtime`` ("python" when absent)."""
        return str(self.manifest.get("runtime", "python"))


def find_model_dir(root: Path, where: str) -> Path:
    """Return ``root`` or its single top-level folder (tgz layout), whichever holds the manifest."""
    if (root / MANIFEST_PATH).is_file():
        return root
    children = [
        child
        for child in root.iterdir()
        if child.name not in _IGNORED_TOP_ENTRIES and not child.name.startswith(".")
    ]
    if len(children) == 1 and children[0].is_dir() and (children[0] / MANIFEST_PATH).is_file():
        return children[0]
    raise ManifestError(f"{where}: no {MANIFEST_PATH} found; this is not a model archive")


def load_model_dir(model_dir: Path, where: str) -> ModelArchive:
    """Read the manifest and model config of an unpacked model folder."""
    model_dir = model_dir.resolve()
    manifest = parse_manifest((model_dir / MANIFEST_PATH).read_bytes(), where)
    return ModelArchive(model_dir, manifest, _load_model_config(model_dir, manifest, where))


def _load_model_config(model_dir: Path, manifest: dict[str, Any], where: str) -> dict[str, Any]:
    name = manifest["model"].get("configFile")
    if not name:
        return {}
    if not isinstance(name, str):
        raise ManifestError(f"{where}: model.configFile must be a file name")
    # The manifest is archive content: never let it point the server at files outside the model.
    path = model_dir / name
    if PurePosixPath(name).is_absolute() or not is_within(model_dir, path):
        raise ManifestError(f"{where}: model.configFile {name!r} points outside the archive")
    if not path.is_file():
        raise ManifestError(f"{where}: config file {name!r} named in the manifest is missing")
    return parse_model_config(path.read_bytes(), f"{where}: {name}")
