"""Tell a model archive's format from its content, not its file name."""

from __future__ import annotations

from enum import Enum
from pathlib import Path

from archiver.errors import ArchiveError


class Format(Enum):
    """How a model archive is stored."""

    DIRECTORY = "directory"
    ZIP = "zip"
    TAR = "tar"  # plain or compressed (gzip, bzip2, xz); tarfile's "r|*" reads them all


_ZIP_MAGICS = (b"PK\x03\x04", b"PK\x05\x06")  # local file header; empty archive
_COMPRESSED_TAR_MAGICS = (b"\x1f\x8b", b"BZh", b"\xfd7zXZ\x00")
_USTAR_OFFSET = 257


def detect_format(source: Path) -> Format:
    """Return the format of ``source``; ArchiveError if it is missing or not an archive."""
    if source.is_dir():
        return Format.DIRECTORY
    if not source.exists():
        raise ArchiveError(f"{source}: no such file or folder")
    try:
        with source.open("rb") as f:
            head = f.read(_USTAR_OFFSET + 8)
    except OSError as exc:
        raise ArchiveError(f"{source}: cannot read: {exc.strerror or exc}") from None
    if head.startswith(_ZIP_MAGICS):
        return Format.ZIP
    if head.startswith(_COMPRESSED_TAR_MAGICS) or head[_USTAR_OFFSET:].startswith(b"ustar"):
        return Format.TAR
    raise ArchiveError(f"{source}: not a model archive (expected a .mar, a .tar.gz or a folder)")
