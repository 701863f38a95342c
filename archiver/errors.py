"""Errors raised by the archiver; every message names what failed and, where known, which entry."""

from __future__ import annotations


class ArchiveError(Exception):
    """Base error: building, reading or extracting a model archive failed."""


class UnsafeArchive(ArchiveError):
    """An entry was refused: extracting it could escape or exhaust the destination."""

    def __init__(self, entry: str, reason: str) -> None:
        super().__init__(f"unsafe archive entry {entry!r}: {reason}")
        self.entry = entry
        self.reason = reason

    def __reduce__(self) -> tuple[type[UnsafeArchive], tuple[str, str]]:
        # Exceptions pickle via self.args (the message); rebuild from the two fields instead.
        return type(self), (self.entry, self.reason)


class ManifestError(ArchiveError):
    """MAR-INF/MANIFEST.json or the model config it names is missing or invalid."""
