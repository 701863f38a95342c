"""Workflow DAG logic, spec parsing and the executor, in-process (the executor with fake nodes)."""

from __future__ import annotations

import asyncio
import json

import pytest

from serve.core.jobs import BatchItem, ItemResult
from serve.wire.errors import ModelNotFound, WorkerError
from serve.workflows.dag import InvalidDAG, build_dag, compose_answer, node_params
from serve.workflows.executor import NodeFailed, NodeReport, run_dag
from serve.workflows.spec import InvalidWorkflowSpec, NodeSettings, parse_spec


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


# ----- build_dag ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("edges", "start", "order", "leaves"),
    [
        # TorchServe's sequential example: input -> function1 -> model1 -> model2 -> function2
        (
            {"function1": ["model1"], "model1": ["model2"], "model2": ["function2"]},
            "function1",
            ("function1", "model1", "model2", "function2"),
            ("function2",),
        ),
        # Its parallel example: pre -> (m1 | m2) -> aggregate
        (
            {"pre": ["m1", "m2"], "m1": ["agg"], "m2": ["agg"]},
            "pre",
            ("pre", "m1", "m2", "agg"),
            ("agg",),
        ),
        # The dog breed shape: a skip edge into a fan-in node
        (
            {"pre": ["cat_dog", "breed"], "cat_dog": ["breed"]},
            "pre",
            ("pre", "cat_dog", "breed"),
            ("breed",),
        ),
        # Two leaves; a leaf listed with no children, or with None
        ({"a": ["b", "c"], "b": [], "c": None}, "a", ("a", "b", "c"), ("b", "c")),
        # One node alone
        ({"only": []}, "only", ("only",), ("only",)),
    ],
    ids=["sequential", "parallel", "skip-edge", "two-leaves", "single"],
)
def test_valid_dags(edges, start, order, leaves) -> None:
    dag = build_dag({k: v or [] for k, v in edges.items()})
    assert (dag.start, dag.order, dag.leaves) == (start, order, leaves)
    for node, kids in dag.children.items():
        for kid in kids:
            assert node in dag.parents[kid]
            assert order.index(node) < order.index(kid)


@pytest.mark.parametrize(
    ("edges", "message"),
    [
        ({"a": ["a"]}, "Self loop"),
        ({"a": ["b"], "c": ["b"]}, "only one start node; found 2"),
        ({"a": ["b"], "b": ["c"], "c": ["b"]}, "Not a valid DAG: a cycle runs through b, c"),
        ({"a": ["b"], "b": ["a"]}, "only one start node; found 0"),
        ({"a": ["b", "b"]}, "Duplicate edge a -> b"),
    ],
    ids=["self-loop", "two-starts", "cycle", "all-cycle", "duplicate"],
)
def test_invalid_dags(edges, message) -> None:
    with pytest.raises(InvalidDAG, match=message) as info:
        build_dag(edges)
    assert info.value.status_code == 400
    assert info.value.error_type == "InvalidDAGException"


# ----- what each node receives ----------------------------------------------------------------


REQUEST = [("body", "image/jpeg", b"IMG"), ("q", None, b"1")]
FANIN = build_dag({"pre": ["m1", "m2"], "m1": ["agg"], "m2": ["agg"]})


@pytest.mark.parametrize(
    ("node", "inputs", "expected"),
    [
        ("pre", [], REQUEST),  # the start node: the client's parameters, content types kept
        ("m1", [("pre", b"P")], [("body", None, b"P")]),  # one parent: "body"
        (
            "agg",
            [("m2", b"two"), ("m1", b"one")],  # several: by parent name, in finishing order
            [("m2", None, b"two"), ("m1", None, b"one")],
        ),
    ],
    ids=["start", "one-parent", "fan-in"],
)
def test_node_params(node, inputs, expected) -> None:
    assert node_params(FANIN, node, REQUEST, inputs) == expected


@pytest.mark.parametrize(
    ("leaves", "expected"),
    [
        ([("a", b"It's a cat!")], b"It's a cat!"),  # one leaf: its bytes, whatever they are
        ([("a", b'{"x": 1}'), ("b", b"[2]")], {"a": {"x": 1}, "b": [2]}),
    ],
)
def test_compose_answer(leaves, expected) -> None:
    answer = compose_answer(leaves)
    assert (json.loads(answer) if isinstance(expected, dict) else answer) == expected


def test_compose_answer_names_a_leaf_that_is_not_json() -> None:
    with pytest.raises(ValueError, match="Leaf node b did not answer JSON"):
        compose_answer([("a", b"{}"), ("b", b"not json")])


# ----- the spec file ------------------------------------------------------------------------


SPEC = """
models:
    min-workers: 1
    max-workers: 2
    batch-size: 4
    max-batch-delay: 100
    retry-attempts: 3
    timeout-ms: 5000
    m1:
       url: model1.mar
       batch-size: 8
       timeout-ms: 700
    m2:
       url: model2.mar
dag:
  pre: [m1, m2]
  m1: [agg]
  m2: [agg]
"""


def test_spec_globals_overrides_and_function_nodes() -> None:
    spec = parse_spec(SPEC)
    assert spec.defaults == NodeSettings(1, 2, 4, 100, 3, 5000)
    assert spec.models["m1"] == ("model1.mar", NodeSettings(1, 2, 8, 100, 3, 700))
    assert spec.settings("m2") == NodeSettings(1, 2, 4, 100, 3, 5000)
    # A function node: one worker, batch 1, no delay; the global retries and timeout.
    assert spec.settings("pre") == NodeSettings(1, 1, 1, 0, 3, 5000)
    assert (spec.is_model("m1"), spec.is_model("agg")) == (True, False)
    assert spec.edges == {"pre": ("m1", "m2"), "m1": ("agg",), "m2": ("agg",)}
    assert spec.dag_text == "{pre=[m1, m2], m1=[agg], m2=[agg]}"


def test_spec_defaults_are_torchserve_s() -> None:
    spec = parse_spec("dag:\n  f: []\n")
    assert spec.defaults == NodeSettings(1, 1, 1, 50, 1, 10000)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("models: [", "Failed to parse yaml"),
        ("- a\n- b\n", "must be a mapping"),
        ("models: {}\n", "no 'dag' section"),
        ("models:\n  m1: {}\ndag:\n  m1: []\n", "Model 'm1' in the spec needs a 'url'"),
        ("models:\n  batch-size: four\ndag:\n  a: []\n", "'batch-size' must be an integer"),
        ("dag:\n  a: b\n", "children must be a list"),
    ],
)
def test_bad_specs(text: str, message: str) -> None:
    with pytest.raises(InvalidWorkflowSpec, match=message) as info:
        parse_spec(text)
    assert info.value.status_code == 400


# ----- the executor, with fake nodes --------------------------------------------------------


class FakeNodes:
    """Nodes that answer after a delay with a function of their parameters, or fail."""

    def __init__(self, delays: dict[str, float] | None = None) -> None:
        self.delays = delays or {}
        self.calls: list[tuple[str, BatchItem]] = []
        self.fail: dict[str, int] = {}  # node -> how many attempts fail before one succeeds
        self.running = 0
        self.peak = 0

    async def __call__(self, node: str, item: BatchItem, timeout: float) -> ItemResult:
        self.calls.append((node, item))
        self.running += 1
        self.peak = max(self.peak, self.running)
        try:
            await asyncio.sleep(self.delays.get(node, 0))
            if self.fail.get(node, 0) > 0:
                self.fail[node] -= 1
                raise WorkerError(f"{node} broke")
            joined = b"+".join(p[2] for p in item.params)
            return ItemResult(200, node.encode() + b"(" + joined + b")", None)
        finally:
            self.running -= 1


def settings_for(dag, **over) -> dict[str, NodeSettings]:
    return {n: over.get(n, NodeSettings(retry_attempts=1, timeout_ms=2000)) for n in dag.order}


@pytest.mark.anyio
async def test_parallel_branches_run_at_once_and_fan_in_by_name() -> None:
    nodes = FakeNodes({"m1": 0.05, "m2": 0.01})
    reports: list[NodeReport] = []
    leaves = await run_dag(
        FANIN,
        settings_for(FANIN),
        [("body", None, b"x")],
        {"h": "1"},
        "rid",
        nodes,
        reports.append,
    )
    assert nodes.peak == 2  # m1 and m2 were in flight together
    # m2 finished first, so its parameter comes first, as TorchServe orders them.
    assert leaves == [("agg", b"agg(m2(pre(x))+m1(pre(x)))")]
    agg = next(item for node, item in nodes.calls if node == "agg")
    assert [p[0] for p in agg.params] == ["m2", "m1"]
    assert agg.request_id == "rid:agg" and agg.headers == {"h": "1"}
    assert sorted(r.node for r in reports) == ["agg", "m1", "m2", "pre"]


@pytest.mark.anyio
async def test_a_failing_node_is_retried_then_named() -> None:
    nodes = FakeNodes()
    nodes.fail["m1"] = 1  # the retry succeeds
    leaves = await run_dag(FANIN, settings_for(FANIN), [], {}, "r1", nodes)
    assert leaves[0][0] == "agg"
    assert [n for n, _ in nodes.calls].count("m1") == 2

    nodes = FakeNodes()
    nodes.fail["m2"] = 5  # retry-attempts 1: two attempts, both fail
    reports: list[NodeReport] = []
    with pytest.raises(NodeFailed, match=r"Error executing m2: failed after 2 attempt") as info:
        await run_dag(FANIN, settings_for(FANIN), [], {}, "r2", nodes, reports.append)
    assert info.value.status_code == 500 and "request id r2" in info.value.message
    assert "agg" not in [n for n, _ in nodes.calls]
    assert [(r.node, r.status, r.attempts) for r in reports if r.node == "m2"] == [("m2", 500, 2)]


@pytest.mark.anyio
async def test_a_slow_node_times_out_per_attempt() -> None:
    nodes = FakeNodes({"m1": 5.0})
    slow = NodeSettings(retry_attempts=0, timeout_ms=50)
    with pytest.raises(NodeFailed, match=r"m1: failed after 1 attempt.*timeout-ms \(50 ms\)"):
        await asyncio.wait_for(
            run_dag(FANIN, settings_for(FANIN, m1=slow), [], {}, "r", nodes), 3.0
        )


@pytest.mark.anyio
async def test_a_missing_model_is_not_retried() -> None:
    async def gone(node: str, item: BatchItem, timeout: float) -> ItemResult:
        raise ModelNotFound(f"Model not found: wf__{node}")

    with pytest.raises(NodeFailed, match="failed after 1 attempt"):
        await run_dag(FANIN, settings_for(FANIN), [], {}, "r", gone)


@pytest.mark.anyio
async def test_an_error_status_from_the_handler_counts_as_a_failure() -> None:
    async def teapot(node: str, item: BatchItem, timeout: float) -> ItemResult:
        return ItemResult(418, b"no", None)

    with pytest.raises(NodeFailed, match="status 418: no"):
        await run_dag(FANIN, settings_for(FANIN), [], {}, "r", teapot)
