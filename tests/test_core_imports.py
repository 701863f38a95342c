"""The layering rules of ``serve``, read from the source: what the core may import, and no cycles.

Both checks read the AST, so they hold without importing anything. The core (``serve/core``) is
what the protocols and the metrics build on: it never imports them, at any level. Module-level
imports (what runs when a module is first imported, outside ``if TYPE_CHECKING:``) form no cycle.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

SERVE = Path(__file__).resolve().parent.parent / "serve"
FORBIDDEN = ("serve.metrics", "serve.http", "serve.grpc")  # to the core


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SERVE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(SERVE.rglob("*.py"))}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _module_level(body: list[ast.stmt]) -> Iterator[ast.Import | ast.ImportFrom]:
    """Imports that run when the module is imported: not in defs, not under TYPE_CHECKING."""
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.If):
            if not _is_type_checking(node):
                yield from _module_level(node.body)
            yield from _module_level(node.orelse)
        elif isinstance(node, ast.Try):
            for block in (node.body, *(h.body for h in node.handlers), node.orelse, node.finalbody):
                yield from _module_level(block)
        elif isinstance(node, ast.With):
            yield from _module_level(node.body)


def _targets(node: ast.Import | ast.ImportFrom, module: str) -> Iterator[str]:
    """The modules an import statement names (``from pkg import sub`` names ``pkg.sub``)."""
    if isinstance(node, ast.Import):
        yield from (alias.name for alias in node.names)
        return
    base = node.module or ""
    if node.level:
        package = module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]
        anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
        base = ".".join([*anchor, base] if base else anchor)
    for alias in node.names:
        yield f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base


def _known(name: str) -> str | None:
    """The deepest module of ``serve`` that ``name`` is or lies in: ``serve.a.B`` -> ``serve.a``."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(module: str, *, module_level: bool) -> set[str]:
    tree = ast.parse(MODULES[module].read_text(encoding="utf-8"))
    if module_level:
        nodes: Iterator[ast.AST] = _module_level(tree.body)
    else:
        nodes = ast.walk(tree)
    found = set()
    for node in nodes:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for target in _targets(node, module):
                known = _known(target) if target.startswith("serve") else None
                if known is not None and known != module:
                    found.add(known)
    return found


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a path that ends where it starts, or None when there is none."""
    done: set[str] = set()
    for root in sorted(graph):
        if root in done:
            continue
        path, on_path = [root], {root}
        stack = [iter(sorted(graph[root]))]
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                stack.pop()
                done.add(path[-1])
                on_path.discard(path.pop())
            elif nxt in on_path:
                return [*path[path.index(nxt) :], nxt]
            elif nxt not in done:
                path.append(nxt)
                on_path.add(nxt)
                stack.append(iter(sorted(graph.get(nxt, ()))))
    return None


@pytest.mark.parametrize(
    ("graph", "cycle"),
    [
        ({"a": {"b"}, "b": {"c"}, "c": set()}, None),
        ({"a": {"b", "c"}, "b": {"c"}, "c": set()}, None),  # a diamond is no cycle
        ({"a": {"b"}, "b": {"a"}}, ["a", "b", "a"]),
        ({"a": {"b"}, "b": {"c"}, "c": {"b"}}, ["b", "c", "b"]),
        ({"a": {"a"}}, ["a", "a"]),
    ],
)
def test_find_cycle(graph: dict[str, set[str]], cycle: list[str] | None) -> None:
    assert find_cycle(graph) == cycle


def test_the_graph_sees_imports_the_ways_serve_writes_them() -> None:
    graph = {m: _imports(m, module_level=True) for m in MODULES}
    assert "serve.metrics.exposition" in graph["serve.metrics.handler"]
    assert "serve.cli.server_record" in graph["serve.cli.control"]  # from serve.cli import x
    assert "serve.core.registry" not in graph["serve.metrics.collectors"]  # TYPE_CHECKING only


def _within(module: str, packages: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


def test_the_core_imports_no_protocol_and_no_metrics() -> None:
    wrong = {
        module: sorted(t for t in _imports(module, module_level=False) if _within(t, FORBIDDEN))
        for module in MODULES
        if _within(module, ("serve.core",))
    }
    assert {m: t for m, t in wrong.items() if t} == {}


def test_no_import_cycles_among_serve_modules() -> None:
    graph = {m: _imports(m, module_level=True) for m in MODULES}
    assert find_cycle(graph) is None
