"""Importing user code (handler files, ``model.py``) from a model directory."""

from __future__ import annotations

import importlib.util
import inspect
import os
import sys
from types import ModuleType


def list_classes_from_module(module: ModuleType, parent_class: type | None = None) -> list[type]:
    """Classes defined in ``module`` itself (not imported into it), optionally subclasses only."""
    classes = [
        member
        for _, member in inspect.getmembers(module, inspect.isclass)
        if member.__module__ == module.__name__
    ]
    if parent_class is not None:
        classes = [c for c in classes if issubclass(c, parent_class)]
    return classes


def ensure_on_sys_path(directory: str | os.PathLike) -> None:
    """Put ``directory`` first on ``sys.path`` (once), so user code can import its siblings."""
    path = os.path.abspath(directory)
    if path in sys.path:
        sys.path.remove(path)
    sys.path.insert(0, path)


# Names user files must never take over in sys.modules: Lantern itself and the ts shim.
_RESERVED = frozenset({"handlers", "archiver", "serve", "ts", "tests"})


def _is_library(module: ModuleType | None) -> bool:
    """A package, a standard-library module or an installed module: not user code to replace."""
    if module is None:
        return False
    name = module.__name__.partition(".")[0]
    file = getattr(module, "__file__", None) or ""
    return (
        hasattr(module, "__path__")
        or name in sys.stdlib_module_names
        or name in _RESERVED
        or "site-packages" in file
        or "dist-packages" in file
        or not file
    )


def import_file(path: str | os.PathLike, module_name: str | None = None) -> ModuleType:
    """Execute a ``.py`` file as module ``module_name`` (default: its stem) and register it.

    Loading by path rather than by name means a model directory's ``handler.py`` or ``model.py``
    wins over a same-named module imported earlier in this process (e.g. another model's). A file
    whose name is taken by a library or Lantern itself (``json.py``, ``handlers.py``) is loaded
    under a private name instead, so it cannot replace that module for the rest of the process.
    """
    path = os.fspath(path)
    name = module_name or os.path.splitext(os.path.basename(path))[0]
    if name in _RESERVED or name in sys.stdlib_module_names or _is_library(sys.modules.get(name)):
        name = f"_lantern_user_{name}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path!r}")
    module = importlib.util.module_from_spec(spec)
    previous = sys.modules.get(name)
    sys.modules[name] = module  # registered first so the module's own classes can be pickled
    try:
        spec.loader.exec_module(module)
    except BaseException:
        if previous is not None:
            sys.modules[name] = previous
        else:
            sys.modules.pop(name, None)
        raise
    return module
