"""build(): the torch-model-archiver equivalent, writing its output atomically."""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Sequence
from pathlib import Path

from archiver.collect import collect, split_extra_files
from archiver.errors import ArchiveError
from archiver.manifest import dump_manifest, make_manifest, validate_model_name
from archiver.model_config import parse_model_config
from archiver.progress import Progress
from archiver.writers import write_folder, write_tgz, write_zip

ARCHIVE_FORMATS = ("default", "zip-store", "tgz", "no-archive")
_SUFFIXES = {"default": ".mar", "zip-store": ".mar", "tgz": ".tar.gz", "no-archive": ""}


def output_path(export_path: str | Path, model_name: str, archive_format: str) -> Path:
    """Where build() writes: ``<export>/<name>.mar``, ``.tar.gz``, or the folder ``<name>``."""
    return Path(export_path) / f"{model_name}{_SUFFIXES[archive_format]}"


def build(
    *,
    model_name: str,
    version: str,
    handler: str,
    serialized_file: str | None = None,
    model_file: str | None = None,
    extra_files: Sequence[str] = (),
    runtime: str = "python",
    export_path: str = ".",
    archive_format: str = "default",
    force: bool = False,
    requirements_file: str | None = None,
    config_file: str | None = None,
) -> Path:
    """Package a model like torch-model-archiver 0.12 and return the path written.

    Everything is checked before anything is written; the archive is packed under a temporary
    dot-name in the export folder and renamed into place, so a failed run leaves no output.
    ``extra_files`` is a list of files, folders and globs (a comma-separated string also works).
    """
    validate_model_name(model_name)
    if not version:
        raise ArchiveError("a model version is required")
    if archive_format not in ARCHIVE_FORMATS:
        raise ArchiveError(
            f"invalid archive format {archive_format!r}: choose one of {', '.join(ARCHIVE_FORMATS)}"
        )
    export_dir = Path(export_path)
    if not export_dir.is_dir():
        raise ArchiveError(f"export path {export_dir} is not a folder")
    output = output_path(export_dir, model_name, archive_format)
    if (output.exists() or output.is_symlink()) and not force:
        raise ArchiveError(f"{output} already exists; use --force to overwrite it")
    if config_file:
        _check_config(Path(config_file))
    # Built first so an invalid runtime is reported before any file is read.
    manifest = dump_manifest(
        make_manifest(
            model_name=model_name,
            version=version,
            handler=handler,
            serialized_file=serialized_file,
            model_file=model_file,
            runtime=runtime,
            requirements_file=requirements_file,
            config_file=config_file,
        )
    )
    entries = collect(
        handler=handler,
        runtime=runtime,
        serialized_file=serialized_file,
        model_file=model_file,
        extra_files=split_extra_files(extra_files),
        requirements_file=requirements_file,
        config_file=config_file,
        exclude=[output.resolve()],
    )
    # A dot-name keeps the partial output out of directory listings and out of extra-files globs.
    temp = export_dir / f".{output.name}.tmp-{uuid.uuid4().hex[:12]}"
    progress = Progress()
    try:
        if archive_format == "tgz":
            write_tgz(temp, model_name, entries, manifest, progress=progress)
        elif archive_format == "no-archive":
            write_folder(temp, entries, manifest, progress=progress)
        else:
            deflate = archive_format == "default"
            write_zip(temp, entries, manifest, deflate=deflate, progress=progress)
        _install(temp, output)
    except OSError as exc:
        _remove(temp)
        raise ArchiveError(f"cannot write {output}: {exc}") from exc
    except BaseException:
        _remove(temp)
        raise
    return output


def _check_config(path: Path) -> None:
    # Validate at build time: a broken model-config.yaml should fail here, not at model load.
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise ArchiveError(f"config file not found: {path}") from None
    except OSError as exc:
        raise ArchiveError(f"cannot read config file {path}: {exc.strerror or exc}") from None
    parse_model_config(data, f"config file {path}")


def _install(temp: Path, output: Path) -> None:
    """Move ``temp`` to ``output``, replacing whatever is there (only reached with force)."""
    if not (output.exists() or output.is_symlink()):
        os.rename(temp, output)
        return
    if temp.is_file() and not (output.is_dir() and not output.is_symlink()):
        os.replace(temp, output)  # atomic: readers see the old archive or the new one
        return
    # A folder cannot be swapped atomically; move the old one aside first so it can be restored.
    aside = output.with_name(f".{output.name}.old-{uuid.uuid4().hex[:12]}")
    os.rename(output, aside)
    try:
        os.rename(temp, output)
    except BaseException:
        os.rename(aside, output)
        raise
    _remove(aside)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    elif path.exists() or path.is_symlink():
        path.unlink(missing_ok=True)
