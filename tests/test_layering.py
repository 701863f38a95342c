"""The layers' import rules, read from the source (AST, nothing imported):

* ``serve/wire`` is the contract both processes import: the standard library, numpy and itself;
* ``handlers/`` (the handler API) reaches into the server only through ``serve.wire``;
* handlers raise their own errors (``handlers.exceptions``, builtins, or a class of the raising
  module, such as TorchServe's metric errors), never one imported from elsewhere.

Imports inside functions count as much as those at the top of a module.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
WIRE_THIRD_PARTY = frozenset({"numpy"})
HANDLER_ERRORS = "handlers.exceptions"


def _module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _package(root: Path, path: Path) -> str:
    name = _module_name(root, path)
    return name if path.name == "__init__.py" else name.rpartition(".")[0]


def imported(root: Path, path: Path, tree: ast.AST) -> Iterator[tuple[int, str]]:
    """``(line, dotted name)`` of everything the module imports: ``import a.b`` gives ``a.b``,
    ``from a import b`` gives ``a.b`` (relative imports resolved against the module's package)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = _from_base(root, path, node)
            for alias in node.names:
                yield node.lineno, f"{base}.{alias.name}" if alias.name != "*" else base


def _from_base(root: Path, path: Path, node: ast.ImportFrom) -> str:
    """The module a ``from ... import`` reads, relative imports resolved."""
    base = node.module or ""
    if not node.level:
        return base
    package = _package(root, path).split(".")
    package = package[: len(package) - (node.level - 1)]
    return ".".join([*package, base] if base else package)


def _within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def _sources(root: Path, folder: str) -> Iterator[tuple[Path, ast.AST]]:
    for path in sorted((root / folder).rglob("*.py")):
        yield path, ast.parse(path.read_text(), str(path))


def wire_violations(root: Path) -> list[str]:
    """Imports of ``serve.wire`` modules that are neither the standard library, numpy nor
    ``serve.wire`` itself."""
    found = []
    for path, tree in _sources(root, "serve/wire"):
        for line, name in imported(root, path, tree):
            top = name.partition(".")[0]
            if top == "serve":
                if not _within(name, "serve.wire"):
                    found.append(f"{path.relative_to(root)}:{line} imports {name}")
            elif top not in sys.stdlib_module_names and top not in WIRE_THIRD_PARTY:
                found.append(f"{path.relative_to(root)}:{line} imports {name}")
    return found


def handler_import_violations(root: Path) -> list[str]:
    """Imports of ``serve`` from ``handlers/`` other than ``serve.wire``."""
    found = []
    for path, tree in _sources(root, "handlers"):
        for line, name in imported(root, path, tree):
            if _within(name, "serve") and not _within(name, "serve.wire"):
                found.append(f"{path.relative_to(root)}:{line} imports {name}")
    return found


def _raised_name(node: ast.Raise) -> str | None:
    """The dotted name a ``raise`` names (``raise X(...)``, ``raise m.X``); None for a re-raise
    or a value (``raise``, ``raise exc``)."""
    target = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
    parts: list[str] = []
    while isinstance(target, ast.Attribute):
        parts.insert(0, target.attr)
        target = target.value
    if isinstance(target, ast.Name):
        return ".".join([target.id, *parts])
    return None


def handler_raise_violations(root: Path) -> list[str]:
    """``raise`` statements in ``handlers/`` of an error imported from anywhere but
    ``handlers.exceptions``."""
    found = []
    for path, tree in _sources(root, "handlers"):
        sources: dict[str, str] = {}  # a name bound by an import -> what it names
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    local = alias.asname or alias.name.partition(".")[0]
                    sources[local] = alias.name if alias.asname else local
            elif isinstance(node, ast.ImportFrom):
                base = _from_base(root, path, node)
                for alias in node.names:
                    sources[alias.asname or alias.name] = f"{base}.{alias.name}"
        for node in ast.walk(tree):
            if not isinstance(node, ast.Raise) or node.exc is None:
                continue
            name = _raised_name(node)
            if name is None:
                continue
            head, _, rest = name.partition(".")
            if head not in sources:  # a builtin, a class of this module, or a value
                continue
            full = ".".join(filter(None, [sources[head], rest]))
            if not _within(full, HANDLER_ERRORS):
                found.append(f"{path.relative_to(root)}:{node.lineno} raises {full}")
    return found


def test_serve_wire_imports_only_the_standard_library_numpy_and_itself() -> None:
    assert wire_violations(REPO) == []


def test_handlers_reach_the_server_only_through_serve_wire() -> None:
    assert handler_import_violations(REPO) == []


def test_handlers_raise_their_own_errors() -> None:
    assert handler_raise_violations(REPO) == []


@pytest.fixture
def planted(tmp_path: Path) -> Path:
    """A tree with one violation of each rule (and code that keeps them)."""
    wire = tmp_path / "serve" / "wire"
    wire.mkdir(parents=True)
    (tmp_path / "serve" / "__init__.py").write_text("")
    (wire / "__init__.py").write_text("from . import frames\n")
    (wire / "frames.py").write_text(
        "import json\nimport numpy as np\nfrom serve.wire.errors import ServeError\n"
        "from .shm import Arena\n"
    )
    (wire / "leaky.py").write_text(
        "import os\n\ndef late():\n    from ..core import jobs\n    import torch\n"
    )
    handlers = tmp_path / "handlers"
    handlers.mkdir()
    (handlers / "exceptions.py").write_text("class TensorError(Exception):\n    pass\n")
    (handlers / "good.py").write_text(
        "from handlers.exceptions import TensorError\nfrom handlers import exceptions\n"
        "from serve.wire.tensors import datatype_of\n\nclass Own(Exception):\n    pass\n\n"
        "def f(exc):\n    raise TensorError('x')\n    raise exceptions.TensorError('y')\n"
        "    raise ValueError('z')\n    raise Own()\n    raise exc\n    raise\n"
    )
    (handlers / "bad.py").write_text(
        "from serve.wire.errors import BadRequest\nimport serve.wire.errors as errors\n\n"
        "def f():\n    from serve.core.jobs import Job\n    raise BadRequest('no')\n"
        "    raise errors.ServeError('no')\n"
    )
    return tmp_path


def test_the_rules_catch_planted_violations(planted: Path) -> None:
    assert wire_violations(planted) == [
        "serve/wire/leaky.py:4 imports serve.core.jobs",
        "serve/wire/leaky.py:5 imports torch",
    ]
    assert handler_import_violations(planted) == ["handlers/bad.py:5 imports serve.core.jobs.Job"]
    assert handler_raise_violations(planted) == [
        "handlers/bad.py:6 raises serve.wire.errors.BadRequest",
        "handlers/bad.py:7 raises serve.wire.errors.ServeError",
    ]
