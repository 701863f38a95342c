"""The workflow DAG as pure functions: validation, topological order, what each node receives.

TorchServe 0.12's rules (``Dag``, ``DagExecutor``): exactly one start node; no self loop and no
cycle; the start node gets the client's request parameters; a node with one parent gets that
parent's output as the parameter ``body``; a node with several parents gets one parameter per
parent, named after it, in the order the parents finished. The answer is the single leaf's
output, or with several leaves a JSON object of their outputs by node name.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from serve.wire.errors import BadRequest

Param = tuple[str, "str | None", bytes]


class InvalidDAG(BadRequest):
    """The dag section does not describe a single-start acyclic graph."""

    error_type = "InvalidDAGException"


@dataclass(frozen=True)
class Dag:
    """A validated DAG: edges both ways, a topological order, its start node and leaves."""

    children: dict[str, tuple[str, ...]]
    parents: dict[str, tuple[str, ...]]
    order: tuple[str, ...]
    start: str
    leaves: tuple[str, ...]


def build_dag(edges: Mapping[str, Sequence[str]]) -> Dag:
    """Validate ``node -> children`` edges and return the `Dag`; raises `InvalidDAG`.

    Linear in nodes + edges, whatever the DAG's shape."""
    children: dict[str, list[str]] = {}
    parents: dict[str, list[str]] = {}
    for node, kids in edges.items():
        children.setdefault(node, [])
        parents.setdefault(node, [])
        seen: set[str] = set()
        for kid in kids:
            if kid == node:
                raise InvalidDAG(f"Self loop exception: node {node} feeds itself.")
            if kid in seen:
                raise InvalidDAG(f"Duplicate edge {node} -> {kid}.")
            seen.add(kid)
            children[node].append(kid)
            children.setdefault(kid, [])
            parents.setdefault(kid, []).append(node)
    starts = [n for n in children if not parents[n]]
    if len(starts) != 1:
        raise InvalidDAG(
            f"DAG should have only one start node; found {len(starts)}: {_some(starts)}"
        )
    order = topological_order(children, parents)
    if len(order) != len(children):
        stuck = sorted(set(children) - set(order))
        raise InvalidDAG(f"Not a valid DAG: a cycle runs through {_some(stuck)}.")
    return Dag(
        {n: tuple(k) for n, k in children.items()},
        {n: tuple(p) for n, p in parents.items()},
        tuple(order),
        starts[0],
        tuple(n for n in order if not children[n]),
    )


def topological_order(
    children: Mapping[str, Sequence[str]], parents: Mapping[str, Sequence[str]]
) -> list[str]:
    """Kahn's order (ties in spec order); nodes on a cycle are left out."""
    waiting = {n: len(parents[n]) for n in children}
    ready = deque(n for n in children if waiting[n] == 0)
    order: list[str] = []
    while ready:
        node = ready.popleft()
        order.append(node)
        for kid in children[node]:
            waiting[kid] -= 1
            if waiting[kid] == 0:
                ready.append(kid)
    return order


def _some(names: Iterable[str], most: int = 10) -> str:
    """The first ``most`` names, comma-separated, then how many more (messages stay short)."""
    listed = list(names)
    more = len(listed) - most
    return ", ".join(listed[:most]) + (f" and {more} more" if more > 0 else "")


def node_params(
    dag: Dag, node: str, request: Sequence[Param], inputs: Sequence[tuple[str, bytes]]
) -> list[Param]:
    """What ``node`` receives: the request's parameters (start node), ``body`` (one parent), or
    one parameter per parent named after it (``inputs``: ``(parent, output)`` as they finished)."""
    if node == dag.start:
        return list(request)
    if len(dag.parents[node]) == 1:
        return [("body", None, inputs[0][1])]
    return [(parent, None, output) for parent, output in inputs]


def compose_answer(leaves: Sequence[tuple[str, bytes]]) -> bytes:
    """The response body: the one leaf's bytes, or ``{leaf: its JSON output}`` for several.

    Raises ValueError naming a leaf whose output is not JSON when there are several.
    """
    if len(leaves) == 1:
        return leaves[0][1]
    answer = {}
    for node, output in leaves:
        try:
            answer[node] = json.loads(output)
        except (ValueError, UnicodeDecodeError):
            raise ValueError(
                f"Leaf node {node} did not answer JSON, which a workflow with several leaves needs."
            ) from None
    return (json.dumps(answer, indent=2) + "\n").encode()
