"""The Open Inference Protocol over gRPC against one real server, driven by ``tritonclient.grpc``.

Models: an ONNX identity model per datatype, a torch-free custom handler registered as two
versions that scale differently (batching on), and an ``idle`` one with no worker.
"""

from __future__ import annotations

import concurrent.futures as cf
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as triton
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)
from tritonclient.utils import InferenceServerException, triton_to_np_dtype

from tests.protocols import models
from tests.support.grpc_stubs import generate
from tests.support.server import LanternServer
from tests.support.waiting import wait_for

DATATYPES = ["INT32", "INT64", "FP32", "FP64", "BOOL", "UINT8", "BYTES", "FP16"]
METADATA = {
    "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}],
    "outputs": [{"name": "scaled", "datatype": "FP32", "shape": [-1, 4]}],
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LanternServer]:
    work = tmp_path_factory.mktemp("grpc-oip")
    store = work / "store"
    store.mkdir()
    models.base_archive(store, "dtypes", models.identity_onnx(work / "ids.onnx", DATATYPES))
    for version, factor in (("1.0", 2), ("2.0", 3)):
        config = {"factor": factor, "metadata": METADATA, "batchSize": 8, "maxBatchDelay": 50}
        models.custom_archive(store, f"custom-{version}", version=version, config=config)
    models.custom_archive(store, "idle", config={"minWorkers": 0, "metadata": METADATA})
    srv = LanternServer(
        work,
        store,
        ["dtypes=dtypes.mar", "custom=custom-1.0.mar", "custom=custom-2.0.mar", "idle=idle.mar"],
    )
    srv.start()
    client = triton.InferenceServerClient(srv.grpc_inference)
    # Not the default version: /ping ignores it.
    wait_for(lambda: client.is_model_ready("custom", "2.0"), 60, "custom 2.0 ready")
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server: LanternServer) -> triton.InferenceServerClient:
    return triton.InferenceServerClient(server.grpc_inference)


def in_flight(server: LanternServer, model: str) -> float:
    """``serve_requests_in_flight`` of ``model``: received and not yet answered."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{server.metrics}/metrics", timeout=10).text
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        if family.name == "serve_requests_in_flight"
        for sample in family.samples
        if sample.labels.get("model") == model
    )


def _status(exc: InferenceServerException) -> str:
    return str(exc.status())


def _x(rows: int = 1) -> triton.InferInput:
    entry = triton.InferInput("x", [rows, 4], "FP32")
    entry.set_data_from_numpy(np.arange(rows * 4, dtype=np.float32).reshape(rows, 4))
    return entry


def test_server_health_and_metadata(client: triton.InferenceServerClient) -> None:
    assert client.is_server_live() and client.is_server_ready()
    meta = client.get_server_metadata(as_json=True)
    assert meta["name"] == "lantern" and meta["version"]
    assert "model_versions" in meta["extensions"]


def test_model_ready_and_metadata(client: triton.InferenceServerClient) -> None:
    assert client.is_model_ready("custom") and client.is_model_ready("custom", "2.0")
    assert not client.is_model_ready("idle")  # registered, no worker
    with pytest.raises(InferenceServerException) as info:
        client.is_model_ready("nope")
    assert _status(info.value) == "StatusCode.NOT_FOUND"
    meta = client.get_model_metadata("custom", "2.0", as_json=True)
    assert meta["name"] == "custom" and meta["versions"] == ["1.0", "2.0"]
    assert meta["platform"] == "python"
    # protobuf's JSON writes int64 as strings
    assert meta["inputs"] == [{"name": "x", "datatype": "FP32", "shape": ["-1", "4"]}]
    assert meta["outputs"] == [{"name": "scaled", "datatype": "FP32", "shape": ["-1", "4"]}]
    dtypes = client.get_model_metadata("dtypes")
    assert [(t.name, t.datatype) for t in dtypes.inputs] == [(f"in_{d}", d) for d in DATATYPES]
    assert list(dtypes.outputs[0].shape) == [-1, 2]


def _sample(datatype: str) -> np.ndarray:
    if datatype == "BYTES":
        return np.array([[b"caf\xc3\xa9", b""], [b"x", b"tensor"]], dtype=object)
    if datatype == "BOOL":
        return np.array([[True, False], [False, True]])
    dtype = triton_to_np_dtype(datatype)
    return (np.arange(4).reshape(2, 2) * (-1 if dtype().dtype.kind in "if" else 1)).astype(dtype)


def test_every_datatype_round_trips_as_raw_contents(client: triton.InferenceServerClient) -> None:
    inputs, outputs, samples = [], [], {}
    for dt in DATATYPES:
        samples[dt] = _sample(dt)
        entry = triton.InferInput(f"in_{dt}", [2, 2], dt)
        entry.set_data_from_numpy(samples[dt])  # tritonclient.grpc sends raw_input_contents
        inputs.append(entry)
        outputs.append(triton.InferRequestedOutput(f"out_{dt}"))
    result = client.infer("dtypes", inputs, outputs=outputs, request_id="dt-1")
    response = result.get_response()
    assert response.id == "dt-1" and response.model_name == "dtypes"
    assert len(response.raw_output_contents) == len(DATATYPES)  # no typed contents
    for dt in DATATYPES:
        got = result.as_numpy(f"out_{dt}")
        out = result.get_output(f"out_{dt}")
        assert out.datatype == dt and list(out.shape) == [2, 2]
        np.testing.assert_array_equal(got, samples[dt])
        assert got.dtype == samples[dt].dtype


def test_versions_reach_their_version(client: triton.InferenceServerClient) -> None:
    x = np.arange(4, dtype=np.float32).reshape(1, 4)
    for version, factor in (("", 2), ("1.0", 2), ("2.0", 3)):
        result = client.infer("custom", [_x()], model_version=version)
        assert result.get_response().model_version == (version or "1.0")
        np.testing.assert_array_equal(result.as_numpy("scaled"), x * factor)


def test_concurrent_requests_batch_as_over_http(
    client: triton.InferenceServerClient, server: LanternServer
) -> None:
    def call(rows: int) -> tuple[int, np.ndarray]:
        result = client.infer("custom", [_x(rows)])
        return rows, result.as_numpy("scaled")

    before = models.batch_stats(server.metrics, "custom")
    with cf.ThreadPoolExecutor(13) as pool:
        # One request holds the worker (0.5 s) while the others arrive: they queue, and batch,
        # however slowly a loaded machine lets them arrive. (tritonclient sends the float as
        # Triton's double_param, which the OIP protos lack: read from the unknown fields.)
        hold = pool.submit(client.infer, "custom", [_x()], parameters={"hold_seconds": 0.5})
        wait_for(lambda: in_flight(server, "custom") >= 1, 30, "the holding request")
        answers = list(pool.map(call, [1 + i % 3 for i in range(36)]))
        hold.result(timeout=60)
    for rows, scaled in answers:
        np.testing.assert_array_equal(scaled, np.arange(rows * 4).reshape(rows, 4) * 2)
    after = models.batch_stats(server.metrics, "custom")
    batches, requests = after[0] - before[0], after[1] - before[1]
    assert requests == 37
    assert batches < requests, "no batch held more than one request"


@pytest.mark.parametrize(
    ("model", "version", "inputs", "code"),
    [
        ("nope", "", lambda: [_x()], "StatusCode.NOT_FOUND"),
        ("custom", "9.0", lambda: [_x()], "StatusCode.NOT_FOUND"),
        ("idle", "", lambda: [_x()], "StatusCode.UNAVAILABLE"),  # model not ready
        ("dtypes", "", lambda: [triton.InferInput("in_FP32", [2, 2], "FP32")], None),
    ],
)
def test_errors(client: triton.InferenceServerClient, model, version, inputs, code) -> None:
    entries = inputs()
    if code is None:  # an input declared but given no data: a malformed request
        code = "StatusCode.INVALID_ARGUMENT"
        entries[0].set_data_from_numpy(np.zeros((2, 2), dtype=np.float32))
        entries[0]._input.shape[:] = [3, 2]  # shape and contents disagree
    with pytest.raises(InferenceServerException) as info:
        client.infer(model, entries, model_version=version)
    assert _status(info.value) == code, info.value.message()


def test_unknown_output_is_invalid_argument(client: triton.InferenceServerClient) -> None:
    with pytest.raises(InferenceServerException) as info:
        client.infer("custom", [_x()], outputs=[triton.InferRequestedOutput("nope")])
    assert _status(info.value) == "StatusCode.INVALID_ARGUMENT"


def test_torchserve_service_name_with_typed_contents(
    server: LanternServer, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """TorchServe's own OIP service name and typed ``contents`` (how its stubs are used)."""
    ts: SimpleNamespace = generate(tmp_path_factory.mktemp("oip-stubs"))
    pb = ts.open_inference_grpc_pb2
    with grpc.insecure_channel(server.grpc_inference) as channel:
        stub = ts.open_inference_grpc_pb2_grpc.GRPCInferenceServiceStub(channel)
        assert stub.ServerLive(pb.ServerLiveRequest()).live
        request = pb.ModelInferRequest(model_name="custom", model_version="2.0")
        tensor = request.inputs.add(name="x", datatype="FP32", shape=[1, 4])
        tensor.contents.fp32_contents.extend([1, 2, 3, 4])
        reply = stub.ModelInfer(request)
        scaled = next(i for i, o in enumerate(reply.outputs) if o.name == "scaled")
        values = np.frombuffer(reply.raw_output_contents[scaled], dtype="<f4")
        np.testing.assert_array_equal(values, [3, 6, 9, 12])
        metadata = stub.ModelMetadata(pb.ModelMetadataRequest(name="custom"))
        assert [i.name for i in metadata.inputs] == ["x"]


def test_health_per_model(server: LanternServer) -> None:
    status = health_pb2.HealthCheckResponse
    with grpc.insecure_channel(server.grpc_inference) as channel:
        health: Any = health_pb2_grpc.HealthStub(channel)  # its stubs declare no methods
        check = health.Check
        assert check(health_pb2.HealthCheckRequest(service="")).status == status.SERVING
        assert check(health_pb2.HealthCheckRequest(service="custom/2.0")).status == status.SERVING
        assert check(health_pb2.HealthCheckRequest(service="idle")).status == status.NOT_SERVING
        watch = health.Watch(health_pb2.HealthCheckRequest(service="custom"))
        assert next(watch).status == status.SERVING
        watch.cancel()


def test_reflection_describes_every_service(server: LanternServer) -> None:
    with grpc.insecure_channel(server.grpc_inference) as channel:
        database = ProtoReflectionDescriptorDatabase(channel)
        services = set(database.get_services())
        assert {
            "inference.GRPCInferenceService",
            "org.pytorch.serve.grpc.openinference.GRPCInferenceService",
            "org.pytorch.serve.grpc.inference.InferenceAPIsService",
            "grpc.health.v1.Health",
        } <= services
        kserve = database.FindFileContainingSymbol("inference.GRPCInferenceService")
        assert kserve.package == "inference"
        assert any(m.name == "ModelInferRequest" for m in kserve.message_type)
    with grpc.insecure_channel(server.grpc_management) as channel:
        services = set(ProtoReflectionDescriptorDatabase(channel).get_services())
        assert "org.pytorch.serve.grpc.management.ManagementAPIsService" in services


def test_a_grpc_client_on_the_http_port_gets_a_clean_error(server: LanternServer) -> None:
    http = triton.InferenceServerClient(server.inference.removeprefix("http://"))
    with pytest.raises(InferenceServerException) as info:
        http.is_server_live()
    if server.runs_uvicorn:  # no HTTP/2 at all: the connection is refused at once
        assert str(info.value.status()) == "StatusCode.UNAVAILABLE"
    else:
        assert str(info.value.status()) == "StatusCode.UNIMPLEMENTED"
        assert f"gRPC inference calls go to {server.grpc_inference}" in info.value.message()
    log = server.log_text("lantern.log") + server.console_text()
    assert "Traceback" not in log and "KeyError" not in log
