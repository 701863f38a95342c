"""``python -m archiver``: the same command as ``model-archiver``."""

from __future__ import annotations

from archiver.cli import main

main()
