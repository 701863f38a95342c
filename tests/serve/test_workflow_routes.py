"""Workflow routes in-process: the model-API switch, and snapshots leaving workflow models out."""

from __future__ import annotations

from pathlib import Path

import pytest
from starlette.testclient import TestClient

from serve.config import Config
from serve.core.model import ModelSource, ModelVersion
from serve.core.registry import ModelEntry, Registry
from serve.http.common import ServerState
from serve.http.management import create_management_app
from serve.metrics.prometheus import ServerMetrics
from serve.workflows.manager import Workflows


def make_state(tmp_path: Path, **config: object) -> ServerState:
    cfg = Config(model_store=str(tmp_path), snapshot=False, **config)  # type: ignore[arg-type]
    metrics = ServerMetrics()
    registry = Registry(cfg, tmp_path / "work", metrics)
    state = ServerState(cfg, registry, metrics)
    state.workflows = Workflows(cfg, registry, tmp_path / "work", metrics)
    return state


@pytest.mark.parametrize(
    ("method", "path"),
    [("POST", "/workflows?url=wf.war"), ("DELETE", "/workflows/wf")],
)
def test_changes_need_the_model_api(tmp_path: Path, method: str, path: str) -> None:
    client = TestClient(create_management_app(make_state(tmp_path)))
    resp = client.request(method, path)
    assert resp.status_code == 405
    assert resp.json()["type"] == "MethodNotAllowedException"


def test_reads_do_not_need_the_model_api(tmp_path: Path) -> None:
    client = TestClient(create_management_app(make_state(tmp_path)))
    assert client.get("/workflows").json() == {"workflows": []}
    assert client.get("/workflows/wf").status_code == 404


def test_with_the_model_api_a_missing_war_is_404(tmp_path: Path) -> None:
    client = TestClient(create_management_app(make_state(tmp_path, enable_model_api=True)))
    resp = client.post("/workflows", params={"url": "wf.war"})
    assert resp.status_code == 404
    assert resp.json()["message"] == "Workflow not found in workflow store: wf.war"


def test_snapshots_leave_workflow_models_out(tmp_path: Path) -> None:
    state = make_state(tmp_path)
    registry = state.registry
    settings = registry.config.default_model_settings()

    def add(name: str, workflow: str | None) -> None:
        source = ModelSource(name + ".mar", tmp_path, {}, {}, None, workflow=workflow)
        mv = ModelVersion(name, "1.0", source, settings, registry.config, tmp_path)
        registry.models[name] = ModelEntry(name, {"1.0": mv}, "1.0")

    add("plain", None)
    add("wf__node", "wf")
    assert list(registry.state()["models"]) == ["plain"]
    assert registry.state()["modelCount"] == 1


def test_workflow_store_is_torchserve_s_key(tmp_path: Path) -> None:
    from serve.config import read_properties

    props = tmp_path / "config.properties"
    props.write_text(f"model_store={tmp_path}\nworkflow_store={tmp_path / 'wf'}\n")
    config = Config.from_mapping(read_properties(props))
    assert config.workflow_store == str(tmp_path / "wf")
    assert Config().workflow_store is None  # then the model store is used
