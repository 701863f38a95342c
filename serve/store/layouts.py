"""One model loader for every layout a model store may hold.

Beside TorchServe's archives, users arrive with the folders other servers read. This module tells
them apart and turns each into what the registry starts: a `ModelArchive` (a model folder, a
manifest, a model-config.yaml-shaped dict). Nothing here imports torch; it runs in the frontend.

Layouts (`RECOGNISERS`, tried in order; the first that claims a path wins):

- ``archive``: a ``.mar`` / ``.tar.gz`` / ``.tgz`` / ``.zip`` file or an unpacked folder holding
  ``MAR-INF/MANIFEST.json`` (one version: the manifest's).
- ``versioned``: Triton's model folder (``config.pbtxt``, optional where the model describes itself,
  and version folders ``1/``, ``2/``...) and OVMS's / TF Serving's tree (``<name>/<version>/``).
  Each version folder holds an archive (file or unpacked) or a model file found by `MODEL_FILES`:
  ``default_model_filename`` from config.pbtxt first, then Triton's names (``model.onnx``, a file
  or a folder; ``model.pt``; ``model.xml`` + ``model.bin``; ``model.py``, Triton's Python
  backend), then any one model file (OVMS names them freely; never a ``.py``).
- ``file``: a bare model file (``.onnx``, ``.pt``, ``.xml`` with its ``.bin``), or a folder that
  holds one directly: version ``1``.

API:

- `recognise(path)` → `ModelLayout` (name, kind, versions, mapped config, what is not honoured);
  `NotAModel` when no layout claims the path (its message is the reason), `LayoutError` (an
  `ArchiveError`) when one does but is broken, naming the file.
- `ModelLayout.served_versions(version)` → the versions to load: ``version`` alone when given,
  else those the layout's version policy serves (Triton's default: the latest one).
- `open_version(layout, version, dest)` → the `ModelArchive` to start. Archives are extracted
  safely into ``dest`` (`archiver.open_archive`); a model file becomes an *implicit archive*:
  ``dest`` gets links to its files and a manifest naming the built-in ``base_handler`` (for
  ``model.py``: ``triton_python``, and the whole version folder is linked), so the worker's
  tensor path serves it with inputs and outputs read from the file. The mapped config
  (`serve.store.triton_config`) is the archive's model config; ``tritonConfig`` in it keeps
  config.pbtxt itself for the model configuration API.
- `ModelLayout.override_config(json)`: Triton's load API's configuration in place of the file.
- `ModelLayout.apply_overlay(Overlay)`: settings given from outside the folder (OVMS's
  config.json, `serve.store.ovms_config`) laid over the layout's.
- `scan_store(store)` → `StoreListing`: the names ``--models all`` loads, and every entry skipped
  with its reason (``serve start`` prints them).

Plugging in a format: add a `ModelFile` to `MODEL_FILES` (a file or folder suffix, the platform
it reports, the handler that loads it, whether any name will do, whether it may be a folder; e.g.
a SavedModel folder ``model.savedmodel`` with a ``tensorflow`` handler), or a recogniser
(``Path -> ModelLayout | None``, raising `LayoutError` for a broken one) to `RECOGNISERS` with
`add_recogniser`; a recogniser that builds its own archives sets `ModelLayout.opener`.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from archiver import ArchiveError, ModelArchive, open_archive
from archiver.manifest import MANIFEST_PATH
from serve.store.triton_config import (
    CONFIG_FILE,
    TRITON_CONFIG,
    LayoutError,
    MappedConfig,
    config_as_json,
    config_from_json,
    map_config,
    read_config,
)
from serve.store.version_policy import PolicyError, parse_policy, served_versions

__all__ = [
    "MODEL_FILES",
    "RECOGNISERS",
    "LayoutError",
    "ModelFile",
    "ModelLayout",
    "NotAModel",
    "Overlay",
    "StoreListing",
    "add_recogniser",
    "open_version",
    "recognise",
    "scan_store",
]

ARCHIVE_SUFFIXES = (".mar", ".tar.gz", ".tgz", ".zip")
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_\-.]*")
_PARTIAL_SUFFIXES = (".tmp", ".part", ".partial", ".crdownload", "~")


class NotAModel(ArchiveError):
    """No layout claims the path; the message says why, for the startup report."""


@dataclass(frozen=True)
class ModelFile:
    """A model file format: how it is found in a version folder and what serves it."""

    suffix: str  # ".onnx": a file (or, for ONNX, a folder) ending so
    platform: str  # the platform Triton reports for it
    handler: str = "base_handler"
    companion: str | None = None  # another file it needs beside it (".bin" for ".xml")
    triton_name: str | None = None  # Triton's default file name for it
    any_name: bool = True  # found under any name (OVMS); False: only as ``triton_name``
    whole_folder: bool = False  # the version folder's other files are served beside it
    folder: bool = False  # may be a folder (``model.onnx/``, a SavedModel's ``model.savedmodel/``)
    inner_file: bool = False  # a folder holds the model as a file of its own name (ONNX's)

    def companion_of(self, path: Path) -> Path | None:
        return path.with_suffix(self.companion) if self.companion else None


MODEL_FILES: list[ModelFile] = [
    ModelFile(".onnx", "onnxruntime_onnx", triton_name="model.onnx", folder=True, inner_file=True),
    ModelFile(".pt", "pytorch_libtorch", triton_name="model.pt"),
    ModelFile(".xml", "openvino", companion=".bin", triton_name="model.xml"),
    # Triton's Python backend: model.py with class TritonPythonModel (handlers/triton_python.py)
    ModelFile(
        ".py",
        "python",
        handler="triton_python",
        triton_name="model.py",
        any_name=False,
        whole_folder=True,
    ),
]


@dataclass(frozen=True)
class Version:
    """One version of a layout: the archive or model file (or folder) that holds it."""

    path: Path
    model_file: ModelFile | None = None  # None: ``path`` is an archive


Opener = Callable[["ModelLayout", str, Path], ModelArchive]


@dataclass
class ModelLayout:
    """A model as found on disk: its name, how it is laid out, its versions and settings."""

    name: str
    kind: str  # "archive", "versioned", "file" (or a plugged-in recogniser's name)
    path: Path
    versions: dict[str, Version]
    mapped: MappedConfig = field(default_factory=MappedConfig)
    config_file: Path | None = None  # the config.pbtxt read, if any
    opener: Opener | None = None  # a plugged-in format's own `open_version`

    @property
    def model_config(self) -> dict[str, Any]:
        return self.mapped.model_config

    @property
    def not_honoured(self) -> list[str]:
        return self.mapped.not_honoured

    def override_config(self, config: dict[str, Any], where: str) -> None:
        """Serve with ``config`` (Triton's ModelConfig as JSON, a load request's override) in
        place of the config.pbtxt on disk, as Triton's load API does."""
        parsed = config_from_json(config, where)
        self.mapped = map_config(parsed, where)
        self.mapped.model_config[TRITON_CONFIG] = config_as_json(parsed)
        _set_platform(self)

    def apply_overlay(self, overlay: Overlay) -> None:
        """Lay ``overlay`` (settings a server config gives this model, e.g. OVMS's config.json)
        over what the layout says: mappings merge key by key, other values replace."""
        _merge(self.mapped.model_config, overlay.model_config)
        self.mapped.not_honoured.extend(overlay.not_honoured)

    def served_versions(self, version: str | None = None) -> list[str]:
        """``version`` alone (if the layout has it), else what the version policy serves."""
        if version is not None:
            if version not in self.versions:
                raise LayoutError(f"{self.path}: has no version {version}")
            return [version]
        try:
            policy = parse_policy(self.model_config.get("versionPolicy"))
        except PolicyError as exc:
            raise LayoutError(f"{self.config_file or self.path}: {exc}") from None
        return served_versions(policy, self.versions)


Recogniser = Callable[[Path], "ModelLayout | None"]


@dataclass(frozen=True)
class Overlay:
    """Settings for a model from outside its folder, and what of them Lantern does not honour."""

    model_config: dict[str, Any] = field(default_factory=dict)
    not_honoured: tuple[str, ...] = ()


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> None:
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            _merge(base[key], value)
        else:
            base[key] = value


def recognise(path: Path) -> ModelLayout:
    """The layout of ``path``; `NotAModel` (with the reason) or `LayoutError` (broken)."""
    path = Path(path)
    if not path.exists():
        raise NotAModel(f"{path}: no such file or folder")
    for recogniser in RECOGNISERS:
        layout = recogniser(path)
        if layout is not None:
            return layout
    raise NotAModel(_why_not(path))


def add_recogniser(recogniser: Recogniser, *, first: bool = False) -> None:
    """Plug in a layout: tried after the others (``first``: before them)."""
    if first:
        RECOGNISERS.insert(0, recogniser)
    else:
        RECOGNISERS.append(recogniser)


def open_version(layout: ModelLayout, version: str, dest: Path) -> ModelArchive:
    """The `ModelArchive` for one version; ``dest`` is an empty folder this call may fill."""
    if layout.opener is not None:
        return layout.opener(layout, version, dest)
    entry = layout.versions[version]
    if entry.model_file is None:
        return open_archive(entry.path, dest)
    return _implicit_archive(layout, version, entry, dest)


# ----- recognisers -------------------------------------------------------------------------------


def _archive(path: Path) -> ModelLayout | None:
    if not _is_archive(path):
        return None
    # The name and version come from the manifest, read when the archive is opened.
    return ModelLayout(_stem(path), "archive", path, {"": Version(path)})


def _versioned(path: Path) -> ModelLayout | None:
    if not path.is_dir():
        return None
    config_path = path / CONFIG_FILE
    config = read_config(config_path) if config_path.is_file() else None
    mapped = MappedConfig()
    if config is not None:
        mapped = map_config(config, str(config_path))
        mapped.model_config[TRITON_CONFIG] = config_as_json(config)
    default_name = config.default_model_filename if config is not None else ""
    versions: dict[str, Version] = {}
    for child in sorted(path.iterdir()):
        if not child.is_dir() or _ignored(child.name) or not NAME.fullmatch(child.name):
            continue
        if child.name == "all":
            continue
        found = _version_content(child, default_name)
        if found is not None:
            versions[child.name] = found
    if not versions:
        if config is None:
            return None
        raise LayoutError(
            f"{config_path}: no version folder of {path.name} holds a model "
            f"({_looked_for(default_name)})"
        )
    name = config.name if config is not None and config.name else path.name
    if config is not None and config.name and config.name != path.name:
        raise LayoutError(
            f"{config_path}: the name {config.name!r} differs from its folder {path.name!r}"
        )
    layout = ModelLayout(name, "versioned", path, versions, mapped, config_path if config else None)
    _set_platform(layout)
    return layout


def _bare_file(path: Path) -> ModelLayout | None:
    if path.is_file():
        model_file = _format_of(path)
        if model_file is None or not model_file.any_name:
            return None  # a lone model.py is no model: Triton's Python backend has folders
        layout = ModelLayout(_stem(path), "file", path, {"1": Version(path, model_file)})
    elif path.is_dir():
        found = _model_in(path, "")
        if found is None or (found.model_file is not None and not found.model_file.any_name):
            return None
        version = path.name if path.name.isdigit() else "1"
        name = path.parent.name if path.name.isdigit() else path.name
        layout = ModelLayout(name, "file", path, {version: found})
    else:
        return None
    _set_platform(layout)
    return layout


RECOGNISERS: list[Recogniser] = [_archive, _versioned, _bare_file]


# ----- what a version folder holds -----------------------------------------------------------


def _version_content(folder: Path, default_name: str) -> Version | None:
    if (folder / MANIFEST_PATH).is_file():
        return Version(folder)
    archives = [p for p in folder.iterdir() if not _ignored(p.name) and _is_archive(p)]
    if len(archives) == 1:
        return Version(archives[0])
    return _model_in(folder, default_name)


def _model_in(folder: Path, default_name: str) -> Version | None:
    """The model file of a version folder: the named one, Triton's names, else the only one."""
    if default_name:
        named = folder / default_name
        if named.exists():
            return Version(named, _format_of(named) or MODEL_FILES[0])
    for model_file in MODEL_FILES:
        if model_file.triton_name and (folder / model_file.triton_name).exists():
            return Version(folder / model_file.triton_name, model_file)
    candidates = [
        p
        for p in sorted(folder.iterdir())
        if not _ignored(p.name) and (found := _format_of(p)) is not None and found.any_name
    ]
    if len(candidates) == 1:
        return Version(candidates[0], _format_of(candidates[0]))
    return None


def _format_of(path: Path) -> ModelFile | None:
    for model_file in MODEL_FILES:
        if path.name.endswith(model_file.suffix) and (path.is_file() or model_file.folder):
            return model_file
    return None


def _set_platform(layout: ModelLayout) -> None:
    """Report the platform Triton reports for the files, unless config.pbtxt names one."""
    metadata = layout.model_config.setdefault("metadata", {})
    formats = {v.model_file.platform for v in layout.versions.values() if v.model_file}
    if "platform" not in metadata and len(formats) == 1:
        metadata["platform"] = formats.pop()


def _implicit_archive(
    layout: ModelLayout, version: str, entry: Version, dest: Path
) -> ModelArchive:
    """``dest`` with links to the model's files and a manifest for the built-in handler."""
    model_file = entry.model_file
    assert model_file is not None
    source = entry.path
    inner = source.is_dir() and model_file.inner_file
    if inner and not (source / source.name).is_file():
        # Triton's model.onnx folder: the graph inside, beside its external data
        raise LayoutError(f"{source}: a {source.name} folder must hold a file named {source.name}")
    companion = model_file.companion_of(source)
    if companion is not None and not companion.is_file():
        raise LayoutError(f"{source}: its weights file {companion.name} is missing")
    dest.mkdir(parents=True, exist_ok=False)
    try:
        links = [source] + ([companion] if companion is not None else [])
        if model_file.whole_folder:  # model.py may import its neighbours
            links += [p for p in sorted(source.parent.iterdir()) if p != source]
        labels = layout.model_config.get("metadata", {}).get("labels", {})
        for label_file in labels.values():
            label_path = layout.path / label_file
            if layout.kind == "versioned" and label_path.is_file():
                links.append(label_path)
        for item in links:
            _link(item, dest / item.name)
        serialized = f"{source.name}/{source.name}" if inner else source.name
        manifest = {
            "runtime": "python",
            "model": {
                "modelName": layout.name,
                "serializedFile": serialized,
                "handler": model_file.handler,
                "modelVersion": version,
            },
        }
        return ModelArchive(dest.resolve(), manifest, dict(layout.model_config))
    except BaseException:
        shutil.rmtree(dest, ignore_errors=True)
        raise


def _link(source: Path, target: Path) -> None:
    """A symbolic link to the user's file: the model is served from where it is, never copied."""
    os.symlink(source.resolve(), target, target_is_directory=source.is_dir())


# ----- listing a store -----------------------------------------------------------------------


@dataclass
class StoreListing:
    """What ``--models all`` loads (names in the store) and what it skipped, with reasons."""

    models: list[str] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)


def scan_store(store: Path) -> StoreListing:
    """Every entry of ``store`` a layout claims; the others with the reason they were skipped.

    A broken layout (a malformed config.pbtxt) is listed, so that loading it reports the error."""
    listing = StoreListing()
    if not store.is_dir():
        return listing
    for entry in sorted(store.iterdir()):
        if _ignored(entry.name):
            continue
        if entry.is_file() and entry.name.endswith(".bin"):
            continue  # an IR pair's weights, served with its .xml
        try:
            recognise(entry)
        except NotAModel as exc:
            listing.skipped.append((entry.name, _reason(exc, entry)))
            continue
        except ArchiveError:
            pass  # broken, but a model: its load reports why
        listing.models.append(entry.name)
    return listing


def _reason(exc: Exception, entry: Path) -> str:
    text = str(exc)
    prefix = f"{entry}: "
    return text[len(prefix) :] if text.startswith(prefix) else text


def _why_not(path: Path) -> str:
    if path.is_file():
        suffixes = ", ".join([*ARCHIVE_SUFFIXES, *(m.suffix for m in MODEL_FILES)])
        return f"{path}: not a model archive or model file (expected one of {suffixes})"
    return (
        f"{path}: not a model folder: no MAR-INF/MANIFEST.json, no {CONFIG_FILE}, and no version "
        f"folder holding a model ({_looked_for('')})"
    )


def _looked_for(default_name: str) -> str:
    names = [default_name] if default_name else []
    names += [m.triton_name for m in MODEL_FILES if m.triton_name]
    names.append("one " + "/".join(f"*{m.suffix}" for m in MODEL_FILES) + " file")
    return "looked for " + ", ".join(names)


def _is_archive(path: Path) -> bool:
    if path.is_file():
        return path.name.lower().endswith(ARCHIVE_SUFFIXES)
    return path.is_dir() and (path / MANIFEST_PATH).is_file()


def _ignored(name: str) -> bool:
    return name.startswith(".") or name.endswith(_PARTIAL_SUFFIXES)


def _stem(path: Path) -> str:
    name = path.name
    for suffix in (*ARCHIVE_SUFFIXES, *(m.suffix for m in MODEL_FILES)):
        if name.lower().endswith(suffix):
            return name[: -len(suffix)]
    return name


def version_of(folder: Path) -> Version | None:
    """What a version folder of a versioned layout holds (an archive or a model), if anything."""
    return _version_content(folder, "")
