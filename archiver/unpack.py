"""Safe extraction of zip and tar archives into an empty folder; each entry is checked first."""

from __future__ import annotations

import os
import stat
import tarfile
import zipfile
import zlib
from pathlib import Path, PurePosixPath
from typing import IO

from archiver.errors import ArchiveError, UnsafeArchive
from archiver.safety import Budget, Limits, is_within, member_path

_CHUNK = 1024 * 1024
_SPECIAL_TYPES = frozenset({stat.S_IFCHR, stat.S_IFBLK, stat.S_IFIFO, stat.S_IFSOCK})
# O_NOFOLLOW: never write through a link, even one that appeared after the checks.
_OPEN_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)


def unpack_zip(source: Path, root: Path, limits: Limits) -> None:
    """Extract a zip into ``root`` after checking every entry in its central directory."""
    try:
        with zipfile.ZipFile(source) as zf:
            plan = _plan_zip(zf.infolist(), Budget(limits))
            budget = Budget(limits)
            for info, rel, is_dir in plan:
                if is_dir:
                    _make_dir(root, rel, info.filename)
                else:
                    with zf.open(info) as src:
                        mode = info.external_attr >> 16
                        _write_file(root, rel, src, info.filename, mode, budget)
    except (zipfile.BadZipFile, zlib.error, EOFError) as exc:
        raise ArchiveError(f"{source}: corrupt zip archive: {exc}") from None
    except NotImplementedError as exc:  # a compression method zipfile cannot decode
        raise ArchiveError(f"{source}: unsupported zip archive: {exc}") from None
    except OSError as exc:
        raise ArchiveError(f"{source}: cannot read zip archive: {exc}") from None


def _plan_zip(
    infos: list[zipfile.ZipInfo], budget: Budget
) -> list[tuple[zipfile.ZipInfo, PurePosixPath, bool]]:
    # The central directory lists everything up front, so refuse before writing a single byte.
    plan = []
    seen: set[PurePosixPath] = set()
    compressed = 0
    for info in infos:
        name = info.filename
        budget.add_entry(name)
        rel = member_path(name)
        is_dir = _zip_entry_is_dir(info)
        if info.flag_bits & 0x1:
            raise ArchiveError(f"archive entry {name!r} is encrypted, which is not supported")
        if rel is None:
            _check_root_entry(name, is_dir)
            continue
        if not is_dir:
            if rel in seen:
                # Two entries with one name: what gets served would depend on the unzip tool.
                raise UnsafeArchive(name, "duplicate entry")
            seen.add(rel)
            budget.declare(name, info.file_size)
            budget.check_ratio(name, info.file_size, info.compress_size)
            # The archive as a whole too: many small entries that each pass (1,000 x 1 MiB of
            # zeros in 1 MB of zip) are a bomb all the same.
            compressed += info.compress_size
            budget.check_ratio(name, budget.declared, compressed, whole=True)
        plan.append((info, rel, is_dir))
    return plan


def _zip_entry_is_dir(info: zipfile.ZipInfo) -> bool:
    """True for a folder entry, False for a file; links and special files are refused."""
    # Unix zip tools keep st_mode in the high 16 bits of external_attr; a link is stored as a
    # regular entry holding the target path, so only these bits reveal it.
    kind = stat.S_IFMT(info.external_attr >> 16)
    if kind == stat.S_IFLNK:
        raise UnsafeArchive(info.filename, "symbolic link")
    if kind in _SPECIAL_TYPES:
        raise UnsafeArchive(info.filename, "device or special file")
    return info.is_dir() or kind == stat.S_IFDIR


def unpack_tar(source: Path, root: Path, limits: Limits) -> None:
    """Extract a (compressed) tar into ``root``, checking each entry before writing it."""
    compressed = source.stat().st_size
    budget = Budget(limits)
    seen: set[PurePosixPath] = set()
    try:
        # Stream mode: one forward pass, and a member's data is only decompressed after its
        # header passed the checks, so a gzip bomb is refused before it is inflated.
        with source.open("rb") as raw, tarfile.open(fileobj=raw, mode="r|*") as tf:
            for member in tf:
                name = member.name
                budget.add_entry(name)
                rel = member_path(name)
                is_dir = _tar_entry_is_dir(member)
                if rel is None:
                    _check_root_entry(name, is_dir)
                    continue
                if is_dir:
                    _make_dir(root, rel, name)
                    continue
                if rel in seen:
                    raise UnsafeArchive(name, "duplicate entry")
                seen.add(rel)
                budget.declare(name, member.size)
                # Tar has no per-entry compressed size: compare the running total to the file.
                budget.check_ratio(name, budget.declared, compressed)
                src = tf.extractfile(member)
                if src is None:  # unreachable for regular files; keeps the type checker honest
                    raise ArchiveError(f"archive entry {name!r} has no data")
                with src:
                    _write_file(root, rel, src, name, member.mode, budget)
    except (tarfile.TarError, zlib.error, EOFError) as exc:
        raise ArchiveError(f"{source}: corrupt tar archive: {exc}") from None
    except OSError as exc:  # gzip/lzma report bad data as OSError subclasses
        raise ArchiveError(f"{source}: cannot read tar archive: {exc}") from None


def _tar_entry_is_dir(member: tarfile.TarInfo) -> bool:
    """True for a folder entry, False for a file; links, devices and the rest are refused."""
    if member.issym():
        raise UnsafeArchive(member.name, "symbolic link")
    if member.islnk():
        raise UnsafeArchive(member.name, "hard link")
    if member.ischr() or member.isblk() or member.isfifo():
        raise UnsafeArchive(member.name, "device or special file")
    if member.isdir():
        return True
    if member.isreg():
        return False
    raise UnsafeArchive(member.name, f"unsupported entry type {member.type!r}")


def _check_root_entry(name: str, is_dir: bool) -> None:
    # "." or "./" names the destination itself: fine as a folder, never as a file.
    if not is_dir:
        raise UnsafeArchive(name, "a file entry cannot replace the destination folder")


def _make_dir(root: Path, rel: PurePosixPath, name: str) -> None:
    target = root / rel
    if not is_within(root, target):
        raise UnsafeArchive(name, "resolves outside the destination")
    try:
        target.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ArchiveError(f"cannot extract archive entry {name!r}: {exc.strerror}") from None


def _write_file(
    root: Path, rel: PurePosixPath, src: IO[bytes], name: str, mode: int, budget: Budget
) -> None:
    target = root / rel
    # Checked before mkdir so no folder is ever made through a path that leaves root.
    if not is_within(root, target):
        raise UnsafeArchive(name, "resolves outside the destination")
    # Keep only the executable bit: no setuid, no world-writable files from an archive.
    perms = 0o755 if mode & 0o111 else 0o644
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(target, _OPEN_FLAGS, perms)
    except OSError as exc:
        raise ArchiveError(f"cannot extract archive entry {name!r}: {exc.strerror}") from None
    with os.fdopen(fd, "wb") as out:
        while chunk := src.read(_CHUNK):
            budget.consume(name, len(chunk))
            try:
                out.write(chunk)
            except OSError as exc:
                raise ArchiveError(f"cannot extract archive entry {name!r}: {exc}") from None
