"""Writers for the four archive formats; each fills a temporary path that build() renames."""

from __future__ import annotations

import io
import os
import shutil
import tarfile
import time
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import IO

from archiver.collect import Entry
from archiver.manifest import MANIFEST_DIR, MANIFEST_NAME, MANIFEST_PATH
from archiver.progress import Progress

_CHUNK = 1024 * 1024


def write_zip(
    target: Path,
    entries: Sequence[Entry],
    manifest: str,
    *,
    deflate: bool,
    progress: Progress,
    manifest_path: str = MANIFEST_PATH,
) -> None:
    """A .mar: files at the zip root, then MAR-INF/MANIFEST.json (DEFLATED or STORED).

    ``manifest_path`` is ``WAR-INF/MANIFEST.json`` for a workflow archive (.war).
    """
    method = zipfile.ZIP_DEFLATED if deflate else zipfile.ZIP_STORED
    # strict_timestamps=False: a file dated before 1980 must not make packing fail.
    with zipfile.ZipFile(target, "w", method, strict_timestamps=False) as zf:
        for entry in entries:
            info = zipfile.ZipInfo.from_file(entry.path, entry.arcname, strict_timestamps=False)
            info.compress_type = method
            with entry.path.open("rb") as src, zf.open(info, "w") as dst:
                _copy(src, dst, entry.arcname, info.file_size, progress)
        info = zipfile.ZipInfo(manifest_path, time.localtime()[:6])
        info.compress_type = method
        info.external_attr = 0o644 << 16
        zf.writestr(info, manifest)


def write_tgz(
    target: Path, model_name: str, entries: Sequence[Entry], manifest: str, *, progress: Progress
) -> None:
    """A .tar.gz with everything under one top folder ``<model_name>/``, as TorchServe writes it."""
    # dereference: pack what a symlinked input points to, never the link itself.
    with tarfile.open(target, "w:gz", dereference=True) as tf:
        for entry in entries:
            info = tf.gettarinfo(str(entry.path), f"{model_name}/{entry.arcname}")
            with entry.path.open("rb") as src:
                reader = _ProgressReader(src, progress)
                progress.start(entry.arcname, info.size)
                tf.addfile(info, reader)
                progress.finish()
        data = manifest.encode("utf-8")
        info = tarfile.TarInfo(f"{model_name}/{MANIFEST_PATH}")
        info.size, info.mode, info.mtime = len(data), 0o644, int(time.time())
        tf.addfile(info, io.BytesIO(data))


def write_folder(
    target: Path, entries: Sequence[Entry], manifest: str, *, progress: Progress
) -> None:
    """The no-archive layout: a folder with the files and MAR-INF/MANIFEST.json."""
    target.mkdir()
    for entry in entries:
        dest = target / entry.arcname
        dest.parent.mkdir(parents=True, exist_ok=True)
        with entry.path.open("rb") as src, dest.open("wb") as dst:
            _copy(src, dst, entry.arcname, os.fstat(src.fileno()).st_size, progress)
        shutil.copymode(entry.path, dest)
    (target / MANIFEST_DIR).mkdir(exist_ok=True)
    (target / MANIFEST_DIR / MANIFEST_NAME).write_text(manifest, encoding="utf-8")


def _copy(src: IO[bytes], dst: IO[bytes], label: str, size: int, progress: Progress) -> None:
    progress.start(label, size)
    while chunk := src.read(_CHUNK):
        dst.write(chunk)
        progress.advance(len(chunk))
    progress.finish()


class _ProgressReader(io.RawIOBase):
    """A read-only file that reports how much tarfile has read from it."""

    def __init__(self, src: IO[bytes], progress: Progress) -> None:
        super().__init__()
        self._src = src
        self._progress = progress

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        data = self._src.read(size)
        self._progress.advance(len(data))
        return data
