"""Opening model archives: safe extraction and reading the manifest without extracting."""

from __future__ import annotations

import re
import shutil
import tarfile
import zipfile
import zlib
from pathlib import Path
from typing import Any

from archiver.archive import ModelArchive, find_model_dir, load_model_dir
from archiver.errors import ArchiveError, ManifestError
from archiver.formats import Format, detect_format
from archiver.manifest import MANIFEST_PATH, MAX_MANIFEST_BYTES, parse_manifest
from archiver.safety import (
    DEFAULT_MAX_ENTRIES,
    DEFAULT_MAX_RATIO,
    DEFAULT_MAX_SIZE,
    Budget,
    Limits,
)
from archiver.unpack import unpack_tar, unpack_zip

# The manifest at the root (.mar) or under one top folder (TorchServe's tgz layout).
_MANIFEST_ENTRY = re.compile(r"^(?:\./)?(?:[^/]+/)?MAR-INF/MANIFEST\.json$")


def open_archive(
    source: Path,
    dest: Path,
    *,
    max_size: int = DEFAULT_MAX_SIZE,
    max_ratio: float = DEFAULT_MAX_RATIO,
    max_entries: int = DEFAULT_MAX_ENTRIES,
) -> ModelArchive:
    """Open a .mar (zip), a .tar.gz or a model folder and return its ModelArchive.

    Archives are extracted into ``dest``, which must be missing or empty (it is created). Every
    entry is checked (no ``..``, absolute paths, links, devices, size or ratio bombs); a refusal
    raises UnsafeArchive and, like any failure, leaves nothing behind in or above ``dest``.
    A folder ``source`` is used in place and ``dest`` is left untouched.
    """
    source = Path(source)
    where = str(source)
    fmt = detect_format(source)
    if fmt is Format.DIRECTORY:
        return load_model_dir(find_model_dir(source, where), where)
    dest = Path(dest)
    created = _prepare_dest(dest)
    root = dest.resolve()
    limits = Limits(max_size=max_size, max_ratio=max_ratio, max_entries=max_entries)
    try:
        if fmt is Format.ZIP:
            unpack_zip(source, root, limits)
        else:
            unpack_tar(source, root, limits)
        return load_model_dir(find_model_dir(root, where), where)
    except BaseException:
        _discard(root, created)
        raise


def read_manifest(source: Path) -> dict[str, Any]:
    """Return the manifest of a .mar, .tar.gz or model folder without extracting anything."""
    source = Path(source)
    where = str(source)
    fmt = detect_format(source)
    if fmt is Format.DIRECTORY:
        model_dir = find_model_dir(source, where)
        return parse_manifest((model_dir / MANIFEST_PATH).read_bytes(), where)
    try:
        data = _zip_manifest(source) if fmt is Format.ZIP else _tar_manifest(source)
    except (zipfile.BadZipFile, tarfile.TarError, zlib.error, EOFError, OSError) as exc:
        raise ArchiveError(f"{source}: cannot read archive: {exc}") from None
    if data is None:
        raise ManifestError(f"{where}: no {MANIFEST_PATH} found; this is not a model archive")
    return parse_manifest(data, where)


def _zip_manifest(source: Path) -> bytes | None:
    with zipfile.ZipFile(source) as zf:
        names = [n for n in zf.namelist() if _MANIFEST_ENTRY.match(n)]
        if not names:
            return None
        # Prefer the root manifest, as extraction does.
        with zf.open(min(names, key=len)) as f:
            return f.read(MAX_MANIFEST_BYTES + 1)


def _tar_manifest(source: Path) -> bytes | None:
    # TorchServe writes the manifest last, so this may read the whole stream: bound it the same
    # way extraction is bounded so peeking at a bomb cannot take forever.
    budget = Budget(Limits())
    compressed = source.stat().st_size
    with source.open("rb") as raw, tarfile.open(fileobj=raw, mode="r|*") as tf:
        for member in tf:
            budget.add_entry(member.name)
            budget.declare(member.name, member.size)
            budget.check_ratio(member.name, budget.declared, compressed)
            if member.isreg() and _MANIFEST_ENTRY.match(member.name):
                src = tf.extractfile(member)
                if src is not None:
                    return src.read(MAX_MANIFEST_BYTES + 1)
    return None


def _prepare_dest(dest: Path) -> Path | None:
    """Make ``dest`` ready; return the topmost folder created for it (None if it existed)."""
    if dest.exists() or dest.is_symlink():
        if not dest.is_dir():
            raise ArchiveError(f"extraction folder {dest} is not a folder")
        if any(dest.iterdir()):
            # Cleanup after a refusal must only ever delete what this call wrote.
            raise ArchiveError(f"extraction folder {dest} is not empty")
        return None
    top = dest.absolute()
    while not top.parent.exists():
        top = top.parent
    try:
        dest.mkdir(parents=True)
    except OSError as exc:
        raise ArchiveError(f"cannot create extraction folder {dest}: {exc.strerror}") from None
    return top


def _discard(root: Path, created: Path | None) -> None:
    if created is not None:
        shutil.rmtree(created, ignore_errors=True)
        return
    for child in root.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child, ignore_errors=True)
        else:
            child.unlink(missing_ok=True)
