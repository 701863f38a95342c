"""TorchServe's own request shapes against one real server, where Lantern once answered otherwise.

Models: handlers written for TorchServe's ``kservev2`` and ``kserve`` envelopes (the envelope named
in their model-config.yaml, as config.properties' ``service_envelope`` names it for all), a
module-level handler that reads the v2 JSON body itself (over HTTP v2 and gRPC OIP), one that
reports what it sees of its process, and the built-in ``text_classifier`` twice: with labels from
0 (explanations) and with labels numbered from 1.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import grpc
import httpx
import numpy as np
import pytest
import torch

from tests.support.grpc_stubs import generate
from tests.support.server import LanternServer, build_archive

HERE = Path(__file__).resolve().parent / "fidelity"
MODELS = ["v2env", "v1env", "v2body", "process", "sentiment", "from_one"]

MODEL_PY = """
import torch
from torch import nn


class SentimentBag(nn.Module):
    def __init__(self):
        super().__init__()
        self.embedding = nn.EmbeddingBag(4, 2, mode="sum")

    def forward(self, text, offsets):
        return self.embedding(text, offsets)
"""


def _text_archive(store: Path, work: Path, name: str, labels: dict[str, str]) -> None:
    folder = work / name
    folder.mkdir()
    weights = torch.zeros(4, 2)
    weights[1] = torch.tensor([0.0, 3.0])  # "good": positive
    weights[2] = torch.tensor([3.0, 0.0])  # "bad": negative
    torch.save({"embedding.weight": weights}, folder / "sentiment.pth")
    torch.save({"<unk>": 0, "good": 1, "bad": 2, "movie": 3}, folder / "source_vocab.pt")
    (folder / "index_to_name.json").write_text(json.dumps(labels))
    (folder / "model.py").write_text(MODEL_PY)
    build_archive(
        store,
        name,
        "text_classifier",
        serialized_file=folder / "sentiment.pth",
        model_file=folder / "model.py",
        extra_files=[folder / "source_vocab.pt", folder / "index_to_name.json"],
    )


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LanternServer]:
    work = tmp_path_factory.mktemp("fidelity")
    store = work / "store"
    store.mkdir()
    build_archive(
        store, "v2env", HERE / "kservev2_handler.py", config={"service_envelope": "kservev2"}
    )
    build_archive(store, "v1env", HERE / "kserve_handler.py", config={"service_envelope": "kserve"})
    build_archive(
        store, "v2body", HERE / "v2_body_handler.py", config={"protocol_inputs": "torchserve"}
    )
    vocab = work / "vocab.txt"
    vocab.write_text("alpha\nbeta\n")
    build_archive(store, "process", HERE / "process_handler.py", extra_files=[vocab])
    _text_archive(store, work, "sentiment", {"0": "negative", "1": "positive"})
    _text_archive(store, work, "from_one", {"1": "negative", "2": "positive"})
    srv = LanternServer(work, store, [f"{m}={m}.mar" for m in MODELS])
    srv.start()
    yield srv
    srv.stop()


def test_kservev2_envelope_over_http_infer_and_explain(server: LanternServer) -> None:
    body = {
        "id": "req-7",
        "inputs": [
            {"name": "x", "shape": [2, 2], "datatype": "FP32", "data": [1, 2, 3, 4]},
            {"name": "y", "shape": [1], "datatype": "INT64", "data": [5]},
        ],
    }
    resp = httpx.post(f"{server.inference}/v2/models/v2env/infer", json=body, timeout=60)
    assert resp.status_code == 200, resp.text
    answer = resp.json()
    assert answer["id"] == "req-7" and answer["model_name"] == "v2env"
    outputs = {o["name"]: o for o in answer["outputs"]}
    assert outputs["x"]["data"] == [2, 4, 6, 8]  # the envelope names outputs after the inputs
    assert outputs["x"]["shape"] == [4]  # and sends them flat, as TorchServe does
    assert outputs["y"]["data"] == [10]
    for path in ("/v2/models/v2env/explain", "/v2/models/v2env/versions/1.0/explain"):
        resp = httpx.post(f"{server.inference}{path}", json=body, timeout=60)
        assert resp.status_code == 200, resp.text
        explained = {o["name"]: o["data"] for o in resp.json()["outputs"]}
        assert explained == {"x": [10], "y": [5]}


def test_kserve_envelope_over_v1_predict(server: LanternServer) -> None:
    body = {"instances": ["a", "bcd"]}
    resp = httpx.post(f"{server.inference}/v1/models/v1env:predict", json=body, timeout=60)
    assert resp.status_code == 200, resp.text
    assert resp.json() == {"predictions": [1, 3]}
    resp = httpx.post(f"{server.inference}/v1/models/v1env:explain", json=body, timeout=60)
    assert resp.json() == {"explanations": [1, 3]}


def test_a_handler_reading_the_v2_body_over_http(server: LanternServer) -> None:
    body = {"inputs": [{"name": "x", "shape": [3], "datatype": "FP32", "data": [1, 2, 3]}]}
    resp = httpx.post(f"{server.inference}/v2/models/v2body/infer", json=body, timeout=60)
    assert resp.status_code == 200, resp.text
    outputs = {o["name"]: o for o in resp.json()["outputs"]}
    assert outputs["neg_x"]["data"] == [-1, -2, -3]
    seen = json.loads(outputs["seen"]["data"][0])
    assert seen == {"id": None, "model_name": "v2body", "keys": ["inputs", "model_name"]}


def test_a_handler_reading_the_v2_body_over_grpc_oip(
    server: LanternServer, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """TorchServe's stubs, typed contents: the handler gets ``{"id", "model_name", "inputs"}``."""
    ts: SimpleNamespace = generate(tmp_path_factory.mktemp("oip-stubs"))
    pb = ts.open_inference_grpc_pb2
    with grpc.insecure_channel(server.grpc_inference) as channel:
        stub = ts.open_inference_grpc_pb2_grpc.GRPCInferenceServiceStub(channel)
        request = pb.ModelInferRequest(model_name="v2body", id="grpc-1")
        tensor = request.inputs.add(name="x", datatype="FP32", shape=[1, 2])
        tensor.contents.fp32_contents.extend([1.5, -2])
        reply = stub.ModelInfer(request, timeout=60)
    assert reply.id == "grpc-1"
    index = {o.name: i for i, o in enumerate(reply.outputs)}
    neg = np.frombuffer(reply.raw_output_contents[index["neg_x"]], dtype="<f4")
    np.testing.assert_array_equal(neg, [-1.5, 2])
    assert list(reply.outputs[index["neg_x"]].shape) == [1, 2]
    raw = reply.raw_output_contents[index["seen"]]
    seen = json.loads(raw[4:])  # BYTES: a 4-byte length, then the element
    assert seen == {"id": "grpc-1", "model_name": "v2body", "keys": ["id", "inputs", "model_name"]}

    with grpc.insecure_channel(server.grpc_inference) as channel:  # and through the envelope
        stub = ts.open_inference_grpc_pb2_grpc.GRPCInferenceServiceStub(channel)
        request = pb.ModelInferRequest(model_name="v2env", id="grpc-2")
        tensor = request.inputs.add(name="x", datatype="INT32", shape=[2])
        tensor.contents.int_contents.extend([3, 4])
        reply = stub.ModelInfer(request, timeout=60)
    assert reply.id == "grpc-2"
    # The envelope's datatype is numpy's for the handler's Python floats, as in TorchServe.
    assert [(o.name, o.datatype, list(o.shape)) for o in reply.outputs] == [("x", "FP64", [2])]
    np.testing.assert_array_equal(np.frombuffer(reply.raw_output_contents[0], "<f8"), [6, 8])


def test_the_worker_runs_in_the_model_directory(server: LanternServer) -> None:
    resp = httpx.post(f"{server.inference}/predictions/process", content=b"x", timeout=60)
    assert resp.status_code == 200, resp.text
    facts = resp.json()
    assert facts["cwd"] == os.path.realpath(facts["model_dir"])
    assert facts["vocab"] == ["alpha", "beta"]  # the archive's own file, by its relative path
    assert facts["model_dir"] in facts["pythonpath"]  # as TorchServe sets PYTHONPATH
    assert facts["model_dir"] in facts["sys_path"]


def test_text_classifier_explanations_in_torchserve_shape(server: LanternServer) -> None:
    resp = httpx.post(
        f"{server.inference}/explanations/sentiment", content=b"good movie", timeout=60
    )
    assert resp.status_code == 200, resp.text
    answer = resp.json()
    assert set(answer) == {"words", "importances"}
    assert answer["words"] == ["good", "movie", "good movie"]
    assert len(answer["importances"]) == 3
    resp = httpx.post(f"{server.inference}/predictions/sentiment", content=b"bad", timeout=60)
    assert max(resp.json().items(), key=lambda kv: kv[1])[0] == "negative"


def test_labels_numbered_from_one_fail_as_in_torchserve(server: LanternServer) -> None:
    resp = httpx.post(f"{server.inference}/predictions/from_one", content=b"good", timeout=60)
    assert resp.status_code == 500
    assert resp.json()["type"] == "KeyError"


def test_options_on_the_metrics_port_describes_its_api(server: LanternServer) -> None:
    resp = httpx.request("OPTIONS", f"{server.metrics}/", timeout=30)
    assert resp.status_code == 200, resp.text
    described = resp.json()
    assert described["openapi"] == "3.0.1"
    assert "/metrics" in described["paths"]
    assert "get" in described["paths"]["/metrics"]
