"""Checks that keep extraction inside its folder and within size limits (Zip Slip, zip bombs)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from archiver.errors import UnsafeArchive

DEFAULT_MAX_SIZE = 8 * 1024**3
DEFAULT_MAX_RATIO = 200.0
DEFAULT_MAX_ENTRIES = 100_000
# Small files compress absurdly well without being bombs (a zeroed buffer, a tiny JSON).
RATIO_MIN_SIZE = 1024 * 1024

_WINDOWS_DRIVE = re.compile(r"^[A-Za-z]:")


@dataclass(frozen=True)
class Limits:
    """What an archive may expand to: total bytes, per-entry ratio, entry count."""

    max_size: int = DEFAULT_MAX_SIZE
    max_ratio: float = DEFAULT_MAX_RATIO
    max_entries: int = DEFAULT_MAX_ENTRIES


def is_within(root: Path, path: Path) -> bool:
    """True if ``path`` resolves inside ``root`` (or is it), following any symlinks on the way.

    ``is_relative_to`` compares path components, so ``dest-evil/x`` is not inside ``dest``, unlike
    the string-prefix check that let TorchServe's Zip Slip fix miss sibling folders.
    """
    return path.resolve().is_relative_to(root.resolve())


def member_path(name: str) -> PurePosixPath | None:
    """The relative path an entry may be written to; None for the archive root itself.

    Refuses absolute paths, Windows drive and backslash forms, NUL bytes and any ``..`` part,
    rather than normalizing them: an archive that needs them is not one we want to host.
    """
    if "\x00" in name:
        raise UnsafeArchive(name, "NUL byte in the entry name")
    if "\\" in name:
        raise UnsafeArchive(name, "backslash in the entry name (Windows path)")
    if _WINDOWS_DRIVE.match(name):
        raise UnsafeArchive(name, "absolute Windows path")
    path = PurePosixPath(name)
    if path.is_absolute():
        raise UnsafeArchive(name, "absolute path")
    if ".." in path.parts:
        raise UnsafeArchive(name, "'..' in the path escapes the destination")
    return path if path.parts else None


class Budget:
    """Counts entries and bytes against Limits; raises UnsafeArchive naming the entry over it."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.entries = 0
        self.declared = 0
        self.written = 0

    def add_entry(self, name: str) -> None:
        """Count one more entry."""
        self.entries += 1
        if self.entries > self.limits.max_entries:
            raise UnsafeArchive(name, f"archive has more than {self.limits.max_entries} entries")

    def declare(self, name: str, size: int) -> None:
        """Check an entry's stated size against the total before reading any of it."""
        self.declared += size
        self._check_total(name, self.declared)

    def check_ratio(self, name: str, size: int, compressed: int, *, whole: bool = False) -> None:
        """Refuse ``size`` bytes coming out of ``compressed`` bytes at an absurd ratio.

        ``whole``: the sizes are the archive's totals so far, not one entry's.
        """
        if size > RATIO_MIN_SIZE:
            ratio = size / max(compressed, 1)
            if ratio > self.limits.max_ratio:
                what = "the archive's compression ratio" if whole else "compression ratio"
                raise UnsafeArchive(
                    name,
                    f"{what} {ratio:.0f}:1 exceeds {self.limits.max_ratio:g}:1 (zip bomb?)",
                )

    def consume(self, name: str, nbytes: int) -> None:
        """Count bytes actually written; stated sizes can lie, so this is checked too."""
        self.written += nbytes
        self._check_total(name, self.written)

    def _check_total(self, name: str, total: int) -> None:
        if total > self.limits.max_size:
            raise UnsafeArchive(
                name, f"total uncompressed size exceeds the limit of {self.limits.max_size} bytes"
            )
