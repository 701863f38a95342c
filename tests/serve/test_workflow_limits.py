"""Hostile workflow specs and archives (issue 27, items 2 and 8): refused at once with a short 400,
parsed off the event loop, without server paths in the answer."""

from __future__ import annotations

import json
import threading
import zipfile
from pathlib import Path

import pytest

from archiver.workflow import WORKFLOW_MANIFEST_PATH
from serve.config import Config, ConfigError
from serve.core.jobs import BatchItem, ItemResult, PartQueue
from serve.core.registry import Registry
from serve.metrics.prometheus import ServerMetrics
from serve.wire.errors import BadRequest, ServeError
from serve.workflows import manager as manager_module
from serve.workflows.dag import Dag, InvalidDAG, build_dag
from serve.workflows.executor import run_dag
from serve.workflows.manager import Workflow, Workflows
from serve.workflows.spec import (
    MAX_NODE_NAME,
    MAX_SPEC_BYTES,
    InvalidWorkflowSpec,
    NodeSettings,
    SpecLimits,
    parse_spec,
)


def alias_bomb(levels: int) -> str:
    """Each level a list of ten of the one before: 10**levels leaves from a few hundred bytes."""
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    for i in range(1, levels):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]")
    return "\n".join(lines) + f"\ndag:\n  start: *a{levels - 1}\n"


def refused(text: str, limits: SpecLimits | None = None) -> str:
    with pytest.raises(InvalidWorkflowSpec) as info:
        parse_spec(text, limits)
    assert info.value.status_code == 400
    assert len(info.value.message) < 400, info.value.message[:400]
    return info.value.message


def test_an_alias_bomb_is_refused_before_it_expands() -> None:
    assert "aliases" in refused(alias_bomb(6))


@pytest.mark.parametrize(
    "text",
    [
        "models: &m {min-workers: 1}\ndag:\n  a: []\n",  # an anchor alone
        "base: &b {url: m.mar}\nmodels:\n  m: {<<: *b}\ndag:\n  m: []\n",  # a merge key
    ],
)
def test_anchors_and_merge_keys_are_refused_too(text: str) -> None:
    assert "anchors and aliases" in refused(text)


def test_deep_nesting_is_refused_not_a_recursion_error() -> None:
    assert "nested more than" in refused("dag:\n  a: " + "[" * 50_000 + "]" * 50_000 + "\n")


def test_an_oversized_spec_is_refused() -> None:
    assert str(MAX_SPEC_BYTES) in refused("#" * (MAX_SPEC_BYTES + 1))


@pytest.mark.parametrize(
    ("dag", "fragment"),
    [
        ("1: [b]", "node names must be strings, got 1"),
        ("a: [[b, c]]", "node names must be strings, got ['b', 'c']"),
        ("a: [{b: c}]", "node names must be strings"),
        ("a: [true]", "node names must be strings, got True"),
        (f"{'n' * (MAX_NODE_NAME + 1)}: []", "invalid node name 'nnnn"),
        ("a: [../b]", "invalid node name '../b'"),
    ],
)
def test_node_names_must_be_short_strings(dag: str, fragment: str) -> None:
    assert fragment in refused(f"dag:\n  {dag}\n")


def test_a_huge_name_is_shown_cut_with_an_ellipsis() -> None:
    message = refused(f"dag:\n  a: [{'b' * 100_000}]\n")
    assert "…" in message and len(message) < 300


def chain(n: int) -> str:
    return "dag:\n" + "".join(f"  n{i}: [n{i + 1}]\n" for i in range(n - 1))


def test_node_and_edge_counts_are_capped() -> None:
    parse_spec(chain(100))  # the default cap: 100 nodes
    assert "more than 100 nodes (workflow_max_nodes)" in refused(chain(101))
    star = "dag:\n  s: [" + ", ".join(f"k{i}" for i in range(20)) + "]\n"
    assert "more than 10 edges" in refused(star, SpecLimits(max_nodes=100, max_edges=10))
    parse_spec(star, SpecLimits(max_nodes=21, max_edges=20))


def test_the_caps_are_config_keys() -> None:
    config = Config(workflow_max_nodes=7, workflow_max_edges=9)
    assert (config.workflow_max_nodes, config.workflow_max_edges) == (7, 9)
    with pytest.raises(ConfigError, match="workflow_max_nodes"):
        Config(workflow_max_nodes=0).validate()


def test_dag_errors_list_a_few_names_not_all() -> None:
    edges = {f"s{i}": () for i in range(90)}
    with pytest.raises(InvalidDAG) as info:
        build_dag(edges)
    assert info.value.message.endswith("s9 and 80 more")


def test_a_wide_dag_keeps_its_order() -> None:
    kids = tuple(f"k{i}" for i in range(5000))
    dag = build_dag({"s": kids, **{k: ("end",) for k in kids}})
    assert dag.order[0] == "s" and dag.order[1:5001] == kids and dag.leaves == ("end",)


# ----- through Workflows.register (in process, no worker started) ----------------------------


MANIFEST = {
    "createdOn": "01/12/2026 10:00:00",
    "workflow": {"workflowName": "w", "specFile": "spec.yaml", "handler": "h.py"},
    "archiverVersion": "0.2.15",
}


def war(path: Path, entries: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in entries.items():
            zf.writestr(name, data)
    return path


def workflows(store: Path, work: Path) -> Workflows:
    config = Config(model_store=str(store), snapshot=False, enable_model_api=True)
    metrics = ServerMetrics()
    return Workflows(config, Registry(config, work, metrics), work, metrics)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the server runs on asyncio (or uvloop), never on trio


@pytest.mark.anyio
async def test_register_parses_the_spec_off_the_loop_and_answers_400(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = tmp_path / "store"
    store.mkdir()
    manifest = json.dumps(MANIFEST).encode()
    war(
        store / "bomb.war",
        {WORKFLOW_MANIFEST_PATH: manifest, "spec.yaml": alias_bomb(9).encode(), "h.py": b""},
    )
    threads: list[threading.Thread] = []
    real = manager_module.parse_spec

    def recording(*args: object) -> object:
        threads.append(threading.current_thread())
        return real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(manager_module, "parse_spec", recording)
    wfs = workflows(store, tmp_path / "work")
    with pytest.raises(BadRequest) as info:
        await wfs.register("bomb.war")
    assert "aliases" in info.value.message and len(info.value.message) < 300
    assert threads and threads[0] is not threading.main_thread()
    assert wfs.workflows == {} and not any((tmp_path / "work" / "workflows").iterdir())


@pytest.mark.parametrize(
    ("entries", "member"),
    [
        ({"../../escape.py": b"x"}, "escape.py"),
        ({"h.py": b""}, "spec.yaml"),  # the manifest names a spec the archive lacks
    ],
    ids=["escaping-member", "missing-member"],
)
@pytest.mark.anyio
async def test_a_hostile_war_is_named_by_its_member_not_by_server_paths(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, entries: dict[str, bytes], member: str
) -> None:
    store = tmp_path / "store"
    store.mkdir()
    war(store / "evil.war", {**entries, WORKFLOW_MANIFEST_PATH: json.dumps(MANIFEST).encode()})
    wfs = workflows(store, tmp_path / "work")
    with pytest.raises(BadRequest) as info:
        await wfs.register("evil.war")
    message = info.value.message
    assert member in message and "evil.war" in message
    assert str(tmp_path) not in message and "/store" not in message, message
    assert "Refused workflow archive evil.war" in caplog.text  # the whole reason: the log's


# ----- /wfpredict and max_response_size (item 3) ---------------------------------------------

LIMIT = 1000
PREDICTIONS_ERROR = f"The model's response exceeds max_response_size of {LIMIT} bytes."


class Outputs:
    """A fake ``invoke``: each node answers the bytes the test gave it (a list: streamed)."""

    def __init__(self, outputs: dict[str, bytes | list[bytes]]) -> None:
        self.outputs = outputs
        self.calls: list[str] = []

    async def __call__(self, node: str, item: BatchItem, timeout: float) -> ItemResult:
        self.calls.append(node)
        out = self.outputs[node]
        if isinstance(out, bytes):
            return ItemResult(200, out, None)
        stream = PartQueue()
        for chunk in out[1:]:
            stream.put_nowait(ItemResult(200, chunk, None))
        stream.put_nowait(None)
        return ItemResult(200, out[0], None, stream=stream)


def settings_of(dag: Dag) -> dict[str, NodeSettings]:
    return {n: NodeSettings(retry_attempts=2, timeout_ms=5000) for n in dag.order}


@pytest.mark.parametrize(
    "big",
    [b"x" * (LIMIT + 1), [b"x" * 600, b"x" * 600]],
    ids=["one-body", "streamed"],
)
@pytest.mark.anyio
async def test_a_node_output_over_max_response_size_ends_the_request(
    big: bytes | list[bytes],
) -> None:
    dag = build_dag({"a": ("b",), "b": ()})
    nodes = Outputs({"a": big, "b": b"never"})
    with pytest.raises(ServeError) as info:
        await run_dag(dag, settings_of(dag), [], {}, "rid", nodes, max_output=LIMIT)
    assert info.value.status_code == 500
    assert info.value.message.startswith(PREDICTIONS_ERROR)
    assert "node a" in info.value.message
    assert nodes.calls == ["a"]  # not retried, and the child never runs


def planned(spec_text: str) -> Workflow:
    spec = parse_spec(spec_text)
    dag = build_dag(spec.edges)
    return Workflow(
        name="w",
        url="w.war",
        archive=None,  # type: ignore[arg-type]
        spec=spec,
        dag=dag,
        models={n: f"w__{n}" for n in dag.order},
        location=None,  # type: ignore[arg-type]
        cleanup_dir=None,
        settings={n: spec.settings(n) for n in dag.order},
    )


@pytest.mark.anyio
async def test_the_combined_answer_is_held_to_the_limit_and_composed_off_the_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = Config(model_store=str(tmp_path), snapshot=False, max_response_size=LIMIT)
    metrics = ServerMetrics()
    wfs = Workflows(
        config, Registry(config, tmp_path / "work", metrics), tmp_path / "work", metrics
    )
    wfs.workflows["w"] = planned("dag:\n  s: [l1, l2]\n")
    half = json.dumps("y" * 490).encode()  # each leaf fits; the two together do not
    nodes = Outputs({"s": b"in", "l1": half, "l2": half})
    monkeypatch.setattr(wfs, "_invoke", lambda wf, node, item, timeout: nodes(node, item, timeout))
    threads: list[threading.Thread] = []
    real = manager_module.compose_answer

    def recording(leaves: list[tuple[str, bytes]]) -> bytes:
        threads.append(threading.current_thread())
        return real(leaves)

    monkeypatch.setattr(manager_module, "compose_answer", recording)
    with pytest.raises(ServeError) as info:
        await wfs.predict("w", [], {}, "rid-1")
    assert info.value.status_code == 500
    assert info.value.message == f"{PREDICTIONS_ERROR} (request id rid-1)"
    assert threads and threads[0] is not threading.main_thread()
    nodes.outputs["l2"] = b"1"
    assert json.loads(await wfs.predict("w", [], {}, "rid-2")) == {"l1": "y" * 490, "l2": 1}
