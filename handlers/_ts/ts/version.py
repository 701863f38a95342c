"""``ts.version``: the TorchServe release whose Python API this shim follows."""

from __future__ import annotations

from ts import __version__

__all__ = ["__version__"]
