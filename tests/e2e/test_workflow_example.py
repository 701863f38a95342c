"""examples/workflow_ensemble: built by its build.py, registered and called as its README says."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator

import httpx
import pytest

from tests.support.server import DATA, REPO, LanternServer

EXAMPLE = REPO / "examples" / "workflow_ensemble"
CAT_CLASSES = range(281, 286)  # tabby, tiger cat, Persian cat, Siamese cat, Egyptian cat


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LanternServer]:
    work = tmp_path_factory.mktemp("workflow_example")
    out = subprocess.run(
        [sys.executable, str(EXAMPLE / "build.py")],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    store = work / "model_store"
    assert sorted(p.name for p in store.iterdir()) == [
        "classifier_onnx.mar",
        "classifier_ts.mar",
        "ensemble.war",
    ]
    srv = LanternServer(work, store, args=["--enable-model-api"])
    srv.start()
    try:
        resp = httpx.post(
            f"{srv.management}/workflows", params={"url": "ensemble.war"}, timeout=300
        )
        assert resp.status_code == 200, resp.text
    except BaseException:
        srv.stop()
        raise
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server: LanternServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.inference, timeout=60) as c:
        yield c


def cat_labels() -> set[str]:
    raw = json.loads((DATA / "index_to_name.json").read_text())
    return {raw[str(i)][-1] for i in CAT_CLASSES}


def test_the_ensemble_averages_both_classifiers(client: httpx.Client, kitten: bytes) -> None:
    resp = client.put("/wfpredict/ensemble", content=kitten)  # curl -T kitten.jpg
    assert resp.status_code == 200, resp.text
    answer = resp.json()
    assert len(answer) == 5
    assert next(iter(answer)) in cat_labels()
    # The node models answer directly too: the ensemble is the mean of their top-10 answers.
    script = client.put("/predictions/ensemble__classifier_ts", content=kitten).json()
    onnx = client.put("/predictions/ensemble__classifier_onnx", content=kitten).json()
    assert len(script) == len(onnx) == 10
    for label, p in answer.items():
        assert p == pytest.approx((script.get(label, 0.0) + onnx.get(label, 0.0)) / 2, abs=1e-6)


def test_a_non_image_stops_at_check_image(client: httpx.Client) -> None:
    resp = client.post("/wfpredict/ensemble", content=b"not an image")
    assert resp.status_code == 500
    assert resp.json()["message"].startswith("Error executing check_image")
    assert client.get("/ping").json() == {"status": "Healthy"}


def test_describe_lists_the_nodes_and_their_workers(server: LanternServer) -> None:
    (described,) = httpx.get(f"{server.management}/workflows/ensemble", timeout=10).json()
    assert described["workflowDag"] == (
        "{check_image=[classifier_ts, classifier_onnx], classifier_ts=[average], "
        "classifier_onnx=[average]}"
    )
    assert {n["name"]: n["type"] for n in described["nodes"]} == {
        "check_image": "function",
        "classifier_ts": "model",
        "classifier_onnx": "model",
        "average": "function",
    }
