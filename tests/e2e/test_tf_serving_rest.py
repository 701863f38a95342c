"""TF Serving's REST API and ONNX Runtime Server's API (REST and gRPC) against one real server.

Models built in code: ``scale`` (ONNX, x FP32 [batch, 4] -> y = x * factor) as versions 1 and 2,
``total`` (x -> the sum of each row, [batch, 1]) and ``linear`` (TorchScript, a Linear layer whose
input dtype nothing declares). Answers are compared with onnxruntime's and torch's own.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpc
import httpx
import numpy as np
import pytest

from serve.grpc import ort_codec
from tests.grpc.test_tf_serving_grpc import total_onnx
from tests.protocols import models
from tests.support.grpc_stubs import generate_tf_serving
from tests.support.server import LanternServer, build_archive
from tests.support.waiting import wait_for


def linear_script(path: Path) -> Path:
    """TorchScript: x [batch, 3] -> a Linear(3, 2) with fixed weights (refuses integer input)."""
    import torch

    torch.manual_seed(0)
    module = torch.jit.script(torch.nn.Linear(3, 2).eval())
    module.save(str(path))
    return path


class RestServer(LanternServer):
    scale: dict[str, Path]
    total: Path
    linear: Path
    stubs: SimpleNamespace


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RestServer]:
    work = tmp_path_factory.mktemp("tfs-rest")
    store = work / "store"
    store.mkdir()
    scale = {}
    for version, factor in (("1", 2.0), ("2", 3.0)):
        scale[version] = models.scale_onnx(work / f"scale{version}.onnx", factor)
        models.base_archive(store, f"scale-{version}", scale[version], version=version)
    total = total_onnx(work / "total.onnx")
    models.base_archive(store, "total", total)
    linear = linear_script(work / "linear.pt")
    build_archive(store, "linear", "base_handler", serialized_file=linear)
    srv = RestServer(
        work,
        store,
        ["scale=scale-1.mar", "scale=scale-2.mar", "total=total.mar", "linear=linear.mar"],
    )
    srv.start()
    srv.scale, srv.total, srv.linear = scale, total, linear
    srv.stubs = generate_tf_serving(work / "stubs")
    wait_for(
        lambda: httpx.get(f"{srv.inference}/v1/models/scale/versions/2").json()["ready"],
        60,
        "scale 2 ready",
    )
    yield srv
    srv.stop()


def post(server: LanternServer, path: str, body: Any, **kwargs: Any) -> httpx.Response:
    return httpx.post(f"{server.inference}{path}", json=body, timeout=60, **kwargs)


def assert_error(resp: httpx.Response, status: int, fragment: str) -> None:
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert set(body) == {"error"} and fragment in body["error"], body


def x_rows(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((2, 4)).astype(np.float32)


# ----- TF Serving REST ---------------------------------------------------------------------------


def test_metadata_renders_a_signature_def(server: RestServer) -> None:
    for path, version in (("", "1"), ("/versions/2", "2"), ("/versions/0", "1")):
        resp = httpx.get(f"{server.inference}/v1/models/scale{path}/metadata", timeout=30)
        assert resp.status_code == 200, resp.text
        body = resp.json()
        assert body["model_spec"] == {"name": "scale", "signature_name": "", "version": version}
        sig = body["metadata"]["signature_def"]["signature_def"]["serving_default"]
        assert sig["method_name"] == "tensorflow/serving/predict"
        assert sig["inputs"]["x"]["dtype"] == "DT_FLOAT"
        assert [d["size"] for d in sig["inputs"]["x"]["tensor_shape"]["dim"]] == ["-1", "4"]
        assert sig["outputs"]["y"]["dtype"] == "DT_FLOAT"


def test_version_zero_is_the_default(server: RestServer) -> None:
    x = x_rows()
    for version, onnx in (("0", "1"), ("1", "1"), ("2", "2")):
        resp = post(
            server, f"/v1/models/scale/versions/{version}:predict", {"instances": x.tolist()}
        )
        assert resp.status_code == 200, resp.text
        want = models.run_onnx(server.scale[onnx], {"x": x})[0]
        np.testing.assert_allclose(resp.json()["predictions"], want, rtol=1e-6)


def test_classify_and_regress(server: RestServer) -> None:
    rows = x_rows(1)
    examples = [{"x": row.tolist()} for row in rows]
    resp = post(server, "/v1/models/scale/versions/2:classify", {"examples": examples})
    assert resp.status_code == 200, resp.text
    want = models.run_onnx(server.scale["2"], {"x": rows})[0]
    result = resp.json()["result"]
    assert [[label for label, _ in row] for row in result] == [["0", "1", "2", "3"]] * 2
    np.testing.assert_allclose([[s for _, s in row] for row in result], want, rtol=1e-6)
    resp = post(server, "/v1/models/total:regress", {"examples": examples})
    assert resp.status_code == 200, resp.text
    want = models.run_onnx(server.total, {"x": rows})[0][:, 0]
    np.testing.assert_allclose(resp.json()["result"], want, rtol=1e-6)


def test_labels_set_by_reload(server: RestServer) -> None:
    stubs = server.stubs
    with grpc.insecure_channel(server.grpc_inference) as channel:
        service = stubs.model_service_pb2_grpc.ModelServiceStub(channel)
        reload = stubs.model_management_pb2.ReloadConfigRequest()
        entry = reload.config.model_config_list.config.add(name="scale", base_path="/m/scale")
        entry.version_labels["canary"] = 2
        service.HandleReloadConfigRequest(reload, timeout=30)
    x = x_rows(2)
    resp = post(server, "/v1/models/scale/labels/canary:predict", {"instances": x.tolist()})
    assert resp.status_code == 200, resp.text
    want = models.run_onnx(server.scale["2"], {"x": x})[0]
    np.testing.assert_allclose(resp.json()["predictions"], want, rtol=1e-6)
    status = httpx.get(f"{server.inference}/v1/models/scale/labels/canary", timeout=30).json()
    assert status["model_version_status"][0]["version"] == "2"
    assert status["model_version_status"][0]["state"] == "AVAILABLE"
    meta = httpx.get(f"{server.inference}/v1/models/scale/labels/canary/metadata", timeout=30)
    assert meta.json()["model_spec"]["version"] == "2"


def test_bad_requests_answer_tf_serving_errors(server: RestServer) -> None:
    x = x_rows().tolist()
    assert_error(
        post(server, "/v1/models/scale:predict", {"signature_name": "predict", "instances": x}),
        400,
        'Serving signature key "predict" not found.',
    )
    assert_error(
        post(server, "/v1/models/scale/labels/nowhere:predict", {"instances": x}),
        400,
        "Unrecognized servable version label: nowhere",
    )
    assert_error(
        httpx.get(f"{server.inference}/v1/models/scale/labels/nowhere/metadata", timeout=30),
        400,
        "Unrecognized servable version label",
    )
    assert_error(post(server, "/v1/models/scale:classify", {"examples": []}), 400, "examples")
    assert_error(post(server, "/v1/models/nope/versions/1:predict", {"instances": x}), 404, "nope")
    # Nothing else disturbed.
    assert post(server, "/v1/models/scale:predict", {"instances": x}).status_code == 200


def test_torchscript_takes_json_integers_and_states_the_dtype_it_learned(
    server: RestServer,
) -> None:
    import torch

    module = torch.jit.load(str(server.linear))
    for rows in ([[1, 2, 3], [4, 5, 6]], [[0.5, 1.5, 2.5]]):
        resp = post(server, "/v1/models/linear:predict", {"instances": rows})
        assert resp.status_code == 200, resp.text
        with torch.no_grad():
            want = module(torch.tensor(rows, dtype=torch.float32)).numpy()
        np.testing.assert_allclose(resp.json()["predictions"], want, rtol=1e-6)
    meta = httpx.get(f"{server.inference}/v2/models/linear", timeout=30).json()
    assert meta["inputs"][0]["datatype"] == "FP32", meta


# ----- ONNX Runtime Server -----------------------------------------------------------------------


def onnx_tensor(array: np.ndarray) -> Any:
    """A real ``onnx.TensorProto`` (the onnx package's own), as an ORT Server client makes it."""
    from onnx import numpy_helper

    return numpy_helper.from_array(array)


def ort_request(x: np.ndarray) -> Any:
    request = ort_codec.predict_request()()
    request.inputs["x"].ParseFromString(onnx_tensor(x).SerializeToString())
    return request


def test_ort_json_raw_and_typed(server: RestServer) -> None:
    x = x_rows(3)
    want = models.run_onnx(server.scale["2"], {"x": x})[0]
    raw = {"dims": ["2", "4"], "dataType": 1, "rawData": base64.b64encode(x.tobytes()).decode()}
    typed = {"dims": ["2", "4"], "dataType": 1, "floatData": x.reshape(-1).tolist()}
    for tensor in (raw, typed):
        resp = post(
            server,
            "/v1/models/scale/versions/2:predict",
            {"inputs": {"x": tensor}, "outputFilter": ["y"]},
            headers={"x-ms-client-request-id": "client-7"},
        )
        assert resp.status_code == 200, resp.text
        assert resp.headers["content-type"].startswith("application/json")
        assert resp.headers["x-ms-client-request-id"] == "client-7"
        assert resp.headers["x-ms-request-id"]
        out = resp.json()["outputs"]["y"]
        assert out["dims"] == ["2", "4"] and out["dataType"] == 1
        got = np.frombuffer(base64.b64decode(out["rawData"]), dtype="<f4").reshape(2, 4)
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize(
    ("content_type", "accept"),
    [
        ("application/octet-stream", None),
        ("application/x-protobuf", "application/vnd.google.protobuf"),
        ("application/vnd.google.protobuf", "application/json"),
    ],
)
def test_ort_protobuf_bodies(server: RestServer, content_type: str, accept: str | None) -> None:
    from onnx import TensorProto, numpy_helper

    x = x_rows(4)
    headers = {"content-type": content_type}
    if accept:
        headers["accept"] = accept
    resp = httpx.post(
        f"{server.inference}/v1/models/scale/versions/1:predict",
        content=ort_request(x).SerializeToString(),
        headers=headers,
        timeout=60,
    )
    assert resp.status_code == 200, resp.text
    want = models.run_onnx(server.scale["1"], {"x": x})[0]
    if accept == "application/json":
        out = resp.json()["outputs"]["y"]
        got = np.frombuffer(base64.b64decode(out["rawData"]), dtype="<f4").reshape(2, 4)
    else:
        assert resp.headers["content-type"] == (accept or "application/octet-stream")
        answer = ort_codec.predict_response().FromString(resp.content)
        y = TensorProto.FromString(answer.outputs["y"].SerializeToString())
        got = numpy_helper.to_array(y)
    np.testing.assert_array_equal(got, want)


def test_ort_errors_in_its_shape(server: RestServer) -> None:
    short = {"dims": ["2", "4"], "dataType": 1, "rawData": base64.b64encode(b"\0" * 28).decode()}
    resp = post(server, "/v1/models/scale/versions/1:predict", {"inputs": {"x": short}})
    assert resp.status_code == 400, resp.text
    body = resp.json()
    assert body["error_code"] == 400 and "raw_data has 28 bytes" in body["error_message"]
    assert resp.headers["x-ms-request-id"]
    resp = httpx.post(
        f"{server.inference}/v1/models/scale/versions/1:predict",
        content=b"\xff\xff not protobuf",
        headers={"content-type": "application/octet-stream"},
        timeout=30,
    )
    assert resp.status_code == 400 and resp.json()["error_message"] == "Invalid payload."
    resp = httpx.post(
        f"{server.inference}/v1/models/nope/versions/1:predict",
        content=ort_request(x_rows()).SerializeToString(),
        headers={"content-type": "application/octet-stream"},
        timeout=30,
    )
    assert resp.status_code == 404 and resp.json()["error_code"] == 404
    # KServe v1 bodies on the same route are unchanged, with their own error shape.
    assert_error(
        post(server, "/v1/models/scale/versions/1:predict", {"bogus": 1}), 400, "instances"
    )


def test_ort_grpc_predict(server: RestServer) -> None:
    x = x_rows(5)
    request, response = ort_codec.predict_request(), ort_codec.predict_response()
    with grpc.insecure_channel(server.grpc_inference) as channel:
        predict = channel.unary_unary(
            "/onnxruntime.server.PredictionService/Predict",
            request_serializer=request.SerializeToString,
            response_deserializer=response.FromString,
        )
        answer = predict(
            ort_request(x), metadata=(("model-name", "scale"), ("model-version", "2")), timeout=30
        )
        with pytest.raises(grpc.RpcError) as caught:  # four models: the call must name one
            predict(ort_request(x), timeout=30)
    got = np.frombuffer(answer.outputs["y"].raw_data, dtype="<f4").reshape(2, 4)
    np.testing.assert_array_equal(got, models.run_onnx(server.scale["2"], {"x": x})[0])
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT


# ----- OVMS's ovmsclient (TF Serving's API, gRPC and REST) -------------------------------------


@pytest.mark.parametrize("kind", ["grpc", "http"])
def test_ovmsclient(server: RestServer, kind: str) -> None:
    import ovmsclient

    if kind == "grpc":
        client = ovmsclient.make_grpc_client(server.grpc_inference)
    else:
        client = ovmsclient.make_http_client(server.inference.removeprefix("http://"))
    x = x_rows(6)
    # ovmsclient sends version 0 when none is given: the default version (1).
    got = client.predict(inputs={"x": x}, model_name="scale")
    np.testing.assert_allclose(got, models.run_onnx(server.scale["1"], {"x": x})[0], rtol=1e-6)
    got = client.predict(inputs={"x": x}, model_name="scale", model_version=2)
    np.testing.assert_allclose(got, models.run_onnx(server.scale["2"], {"x": x})[0], rtol=1e-6)
    meta = client.get_model_metadata(model_name="scale", model_version=2)
    assert meta["model_version"] == 2
    assert meta["inputs"]["x"] == {"shape": [-1, 4], "dtype": "DT_FLOAT"}
    assert meta["outputs"]["y"]["dtype"] == "DT_FLOAT"
    status = client.get_model_status(model_name="scale")
    assert {v: s["state"] for v, s in status.items()} == {1: "AVAILABLE", 2: "AVAILABLE"}
    with pytest.raises(ovmsclient.ModelNotFoundError):
        client.predict(inputs={"x": x}, model_name="nope")
