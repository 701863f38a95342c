"""Lantern's stand-in for TorchServe's ``ts`` package (see ``handlers.compat``)."""

from __future__ import annotations

__version__ = "0.12.0"  # the TorchServe release whose handler API this shim follows
LANTERN_SHIM = True
