"""The command line (``serve`` / ``lantern``): start, stop, status, logs, kserve and ray."""

from serve.cli.main import main

__all__ = ["main"]
