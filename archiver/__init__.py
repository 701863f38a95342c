"""Lantern's model archiver: build TorchServe-compatible .mar archives and open them safely.

Imported by the server frontend, so nothing here may import torch.
"""

from __future__ import annotations

from archiver.archive import ModelArchive
from archiver.build import build
from archiver.errors import ArchiveError, ManifestError, UnsafeArchive
from archiver.extract import open_archive, read_manifest

__all__ = [
    "ArchiveError",
    "ManifestError",
    "ModelArchive",
    "UnsafeArchive",
    "build",
    "open_archive",
    "read_manifest",
]
