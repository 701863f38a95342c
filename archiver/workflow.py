"""Workflow archives (.war): built as torch-workflow-archiver 0.2.15 builds them, opened safely.

A .war is a zip with the spec file, the handler file and any extra files at its root, and
``WAR-INF/MANIFEST.json``::

    {"createdOn": "01/12/2026 10:00:00",
     "workflow": {"workflowName": "wf", "specFile": "spec.yaml", "handler": "handler.py"},
     "archiverVersion": "0.2.15"}

Opening uses the same checked extraction as model archives (no ``..``, links or bombs).
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path, PurePosixPath
from typing import Any

from archiver.collect import Entry, extra_entries
from archiver.errors import ArchiveError, ManifestError
from archiver.formats import Format, detect_format
from archiver.manifest import CREATED_ON_FORMAT, MAX_MANIFEST_BYTES, validate_model_name
from archiver.progress import Progress
from archiver.safety import (
    DEFAULT_MAX_ENTRIES,
    DEFAULT_MAX_RATIO,
    DEFAULT_MAX_SIZE,
    Limits,
    is_within,
)
from archiver.unpack import unpack_zip
from archiver.writers import write_zip

WAR_INF = "WAR-INF"
WORKFLOW_MANIFEST_PATH = f"{WAR_INF}/MANIFEST.json"
# The torch-workflow-archiver release whose output ours matches (TorchServe 0.12 ships it).
WORKFLOW_ARCHIVER_VERSION = "0.2.15"
WAR_SUFFIX = ".war"


def make_workflow_manifest(
    *, workflow_name: str, spec_file: str, handler: str, created_on: datetime | None = None
) -> dict[str, Any]:
    """The manifest dict, keys in the order torch-workflow-archiver writes them."""
    validate_model_name(workflow_name)
    return {
        "createdOn": (created_on or datetime.now()).strftime(CREATED_ON_FORMAT),
        "workflow": {
            "workflowName": workflow_name,
            "specFile": os.path.basename(spec_file),
            "handler": os.path.basename(handler),
        },
        "archiverVersion": WORKFLOW_ARCHIVER_VERSION,
    }


def build_workflow(
    *,
    workflow_name: str,
    spec_file: str,
    handler: str,
    extra_files: Sequence[str] | str = (),
    export_path: str = ".",
    force: bool = False,
) -> Path:
    """Write ``<export_path>/<workflow_name>.war`` and return its path.

    Everything is checked before anything is written, and the archive is renamed into place,
    so a failed run leaves no output. Extra files are files, folders (their contents go to the
    root) and globs, as for model archives; torch-workflow-archiver takes files only.
    """
    validate_model_name(workflow_name)
    export_dir = Path(export_path)
    if not export_dir.is_dir():
        raise ArchiveError(f"export path {export_dir} is not a folder")
    output = export_dir / f"{workflow_name}{WAR_SUFFIX}"
    if (output.exists() or output.is_symlink()) and not force:
        raise ArchiveError(f"{output} already exists; use --force to overwrite it")
    if output.is_dir() and not output.is_symlink():
        raise ArchiveError(f"{output} is a folder; remove it first")
    entries: dict[str, Path] = {}
    for label, value in (("spec file", spec_file), ("handler file", handler)):
        path = Path(value)
        if not path.is_file():
            raise ArchiveError(f"{label} not found: {path}")
        entries[path.name] = path
    # As torch-workflow-archiver copies into one folder, a later file replaces an earlier one.
    for entry in extra_entries(extra_files, [output.resolve()]):
        if PurePosixPath(entry.arcname).parts[0] == WAR_INF:
            continue  # our manifest is written last; never let a stale one shadow it
        entries[entry.arcname] = entry.path
    manifest = json.dumps(
        make_workflow_manifest(workflow_name=workflow_name, spec_file=spec_file, handler=handler),
        indent=2,
    )
    temp = export_dir / f".{output.name}.tmp-{uuid.uuid4().hex[:12]}"
    try:
        write_zip(
            temp,
            [Entry(name, path) for name, path in entries.items()],
            manifest,
            deflate=True,
            progress=Progress(),
            manifest_path=WORKFLOW_MANIFEST_PATH,
        )
        os.replace(temp, output)
    except OSError as exc:
        temp.unlink(missing_ok=True)
        raise ArchiveError(f"cannot write {output}: {exc}") from exc
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    return output


@dataclass(frozen=True)
class WorkflowArchive:
    """An unpacked workflow: its folder, manifest, and the spec and handler files in it."""

    workflow_dir: Path
    manifest: dict[str, Any]

    @property
    def workflow_name(self) -> str:
        return str(self.manifest["workflow"]["workflowName"])

    @property
    def spec_file(self) -> Path:
        return self.workflow_dir / self.manifest["workflow"]["specFile"]

    @property
    def handler(self) -> str | None:
        """The handler file's name in the folder, if the manifest names one."""
        return self.manifest["workflow"].get("handler") or None


def parse_workflow_manifest(data: bytes, where: str) -> dict[str, Any]:
    """Parse and check WAR-INF/MANIFEST.json: TorchServe's checks, plus the spec file name."""
    if len(data) > MAX_MANIFEST_BYTES:
        raise ManifestError(f"{where}: {WORKFLOW_MANIFEST_PATH} is too large")
    try:
        manifest = json.loads(data.decode("utf-8-sig"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ManifestError(f"{where}: {WORKFLOW_MANIFEST_PATH} is not valid JSON: {exc}") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("workflow"), dict):
        raise ManifestError("Missing Workflow entry in manifest file.")
    workflow = manifest["workflow"]
    if not isinstance(workflow.get("workflowName"), str) or not workflow["workflowName"]:
        raise ManifestError("Workflow name is not defined.")
    if manifest.get("archiverVersion") is None:
        raise ManifestError("Workflow archive version is not defined.")
    if manifest.get("createdOn") is None:
        raise ManifestError("Workflow archive createdOn is not defined.")
    for key in ("specFile", "handler"):
        value = workflow.get(key)
        if value is None and key == "handler":
            continue
        if not isinstance(value, str) or not value:
            raise ManifestError(f"{where}: workflow.{key} is not defined")
    return manifest


def open_workflow(
    source: Path,
    dest: Path,
    *,
    max_size: int = DEFAULT_MAX_SIZE,
    max_ratio: float = DEFAULT_MAX_RATIO,
    max_entries: int = DEFAULT_MAX_ENTRIES,
) -> WorkflowArchive:
    """Open a .war (zip) by extracting it into ``dest`` (created; must be empty), or a folder
    holding ``WAR-INF/MANIFEST.json`` in place. Failures leave nothing in ``dest``."""
    source = Path(source)
    where = str(source)
    fmt = detect_format(source)
    if fmt is Format.DIRECTORY:
        return _load(source.resolve(), where)
    if fmt is not Format.ZIP:
        raise ArchiveError(f"{where}: a workflow archive must be a .war (zip) file")
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    if any(dest.iterdir()):
        raise ArchiveError(f"extraction folder {dest} is not empty")
    root = dest.resolve()
    try:
        unpack_zip(source, root, Limits(max_size, max_ratio, max_entries))
        return _load(root, where)
    except BaseException:
        shutil.rmtree(root, ignore_errors=True)
        raise


def _load(folder: Path, where: str) -> WorkflowArchive:
    path = folder / WORKFLOW_MANIFEST_PATH
    if not path.is_file():
        raise ManifestError(f"{where}: no {WORKFLOW_MANIFEST_PATH}; this is not a workflow archive")
    manifest = parse_workflow_manifest(path.read_bytes(), where)
    workflow = manifest["workflow"]
    # Archive content names these files: they must stay inside the folder.
    for key in ("specFile", "handler"):
        name = workflow.get(key)
        if name is None:
            continue
        file = folder / name
        if PurePosixPath(name).is_absolute() or not is_within(folder, file):
            raise ManifestError(f"{where}: workflow.{key} {name!r} points outside the archive")
        if not file.is_file():
            raise ManifestError(f"{where}: {key} {name!r} named in the manifest is missing")
    return WorkflowArchive(folder, manifest)
