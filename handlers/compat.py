"""Making unmodified TorchServe handlers (``import ts...``) run on Lantern.

``install_ts_alias()`` puts the shim package ``handlers/_ts/ts`` first on ``sys.path`` and drops
any ``ts`` modules already imported from elsewhere, so the shim wins even over an installed
TorchServe. Call it in the worker before loading the handler; it is idempotent.
"""

from __future__ import annotations

import importlib
import os
import sys

SHIM_ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_ts")


def _is_shim(module: object) -> bool:
    path = getattr(module, "__file__", None) or ""
    return os.path.abspath(path).startswith(SHIM_ROOT + os.sep)


def install_ts_alias() -> None:
    """Make ``import ts`` (and ``ts.*``) resolve to Lantern's shim in this process."""
    if sys.path[:1] != [SHIM_ROOT]:
        while SHIM_ROOT in sys.path:
            sys.path.remove(SHIM_ROOT)
        sys.path.insert(0, SHIM_ROOT)
    existing = sys.modules.get("ts")
    if existing is not None and not _is_shim(existing):
        for name in [n for n in sys.modules if n == "ts" or n.startswith("ts.")]:
            del sys.modules[name]
    importlib.invalidate_caches()
