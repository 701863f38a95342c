"""Which frameworks a model's workers will import, known at registration (frontend side, pure).

Warm spares (`serve.worker.spares`) preload the frameworks a model's workers use. Reading them off
a worker that has loaded means the first worker of a server, and the replacement of its first
crash, start cold; this module reads them off the archive instead, without importing anything:
the handler's own file (in the model folder) or the built-in handler, and the ``handlers.*`` and
``ts.*`` modules they import, are parsed (`ast`) for their module-level imports, and a serialized
``.onnx`` file means ONNX Runtime. Only imports that run when the module is imported count, so a
prediction never makes a worker carry a framework its handler would not have imported; what a
handler imports later (inside a function) is still learnt from the worker's LOADED report.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from serve.worker.spares import PRELOADABLE

_HANDLERS = Path(__file__).resolve().parent.parent.parent / "handlers"
_ROOTS = {"handlers": _HANDLERS, "ts": _HANDLERS / "_ts" / "ts"}
_MAX_FILES = 64  # a bound on the walk through a handler's imports


def archive_frameworks(
    manifest: Mapping[str, Any], model_dir: Path, handler: str | None = None
) -> frozenset[str]:
    """The `PRELOADABLE` frameworks a worker of this archive imports as its handler loads."""
    model = manifest.get("model") or {}
    spec = handler or model.get("handler") or ""
    found: set[str] = set()
    name = str(spec).split(":", 1)[0]
    local = model_dir / (name if name.endswith(".py") else f"{name}.py")
    if name and local.is_file():
        found |= _imports_of(local, model_dir)
    elif name:
        path = _module_file(f"handlers.{name}")
        if path is not None:
            found |= _walk(path)
    if str(model.get("serializedFile") or "").endswith(".onnx"):
        found.add("onnxruntime")
    return frozenset(found)


def _imports_of(path: Path, model_dir: Path) -> frozenset[str]:
    """A handler file in the model folder: its imports, and those of modules beside it."""
    found: set[str] = set()
    for module in _top_level_imports(path):
        sibling = model_dir / f"{module.split('.')[0]}.py"
        if sibling.is_file() and sibling != path:
            found |= {m.split(".")[0] for m in _top_level_imports(sibling)} & set(PRELOADABLE)
        found |= _follow(module)
    return frozenset(found)


def _follow(module: str) -> frozenset[str]:
    top = module.split(".")[0]
    if top in PRELOADABLE:
        return frozenset({top})
    path = _module_file(module)
    return _walk(path) if path is not None else frozenset()


@functools.lru_cache(maxsize=256)
def _walk(start: Path) -> frozenset[str]:
    """The frameworks imported, at module level, by ``start`` and the Lantern modules it imports."""
    found: set[str] = set()
    seen: set[Path] = set()
    todo = [start]
    while todo and len(seen) < _MAX_FILES:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        for module in _top_level_imports(path):
            top = module.split(".")[0]
            if top in PRELOADABLE:
                found.add(top)
            nested = _module_file(module)
            if nested is not None:
                todo.append(nested)
    return frozenset(found)


def _module_file(module: str) -> Path | None:
    """The file of a ``handlers.*`` or ``ts.*`` module, or None for anything else."""
    parts = module.split(".")
    root = _ROOTS.get(parts[0])
    if root is None:
        return None
    base = root.joinpath(*parts[1:])
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def _top_level_imports(path: Path) -> list[str]:
    """Modules a file imports in its module body (not in functions, classes or ``try``)."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8", errors="replace"))
    except (OSError, SyntaxError, ValueError):
        return []
    modules: list[str] = []
    for node in tree.body:
        if isinstance(node, ast.Import):
            modules += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            modules.append(node.module)
            modules += [f"{node.module}.{alias.name}" for alias in node.names]
    return modules
