"""TF Serving's gRPC API against one real server, with stubs generated from TF Serving's protos.

Models built in code: ``scale`` (ONNX, x FP32 [batch, 4] -> y = x * factor) as versions 1 and 2
with different factors, ``total`` (x FP32 [batch, 4] -> value = x summed, [batch, 1]) for Regress,
and ``dtypes`` (an ONNX identity per datatype). Answers are compared with onnxruntime's own.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import grpc
import numpy as np
import pytest
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

from tests.protocols import models
from tests.support.grpc_stubs import generate_tf_serving
from tests.support.server import LanternServer
from tests.support.waiting import wait_for

DATATYPES = ["INT32", "INT64", "FP32", "FP64", "BOOL", "UINT8", "BYTES", "FP16"]


def total_onnx(path: Path) -> Path:
    """x FP32 [batch, 4] -> value FP32 [batch, 1], the sum of each row."""
    from onnx import TensorProto, helper, save

    graph = helper.make_graph(
        [helper.make_node("ReduceSum", ["x", "axes"], ["value"], keepdims=1)],
        "total",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("value", TensorProto.FLOAT, ["batch", 1])],
        initializer=[helper.make_tensor("axes", TensorProto.INT64, [1], [1])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    save(model, str(path))
    return path


class TfsServer(LanternServer):
    scale: dict[str, Path]
    total: Path
    stubs: SimpleNamespace


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TfsServer]:
    work = tmp_path_factory.mktemp("tfs-grpc")
    store = work / "store"
    store.mkdir()
    scale = {}
    for version, factor in (("1", 2.0), ("2", 3.0)):
        scale[version] = models.scale_onnx(work / f"scale{version}.onnx", factor)
        config = {"batchSize": 8, "maxBatchDelay": 20}
        models.base_archive(
            store, f"scale-{version}", scale[version], version=version, config=config
        )
    total = total_onnx(work / "total.onnx")
    models.base_archive(store, "total", total)
    models.base_archive(store, "dtypes", models.identity_onnx(work / "ids.onnx", DATATYPES))
    srv = TfsServer(
        work,
        store,
        ["scale=scale-1.mar", "scale=scale-2.mar", "total=total.mar", "dtypes=dtypes.mar"],
    )
    srv.start()
    srv.scale, srv.total = scale, total
    srv.stubs = generate_tf_serving(work / "stubs")
    channel = grpc.insecure_channel(srv.grpc_inference)
    status = srv.stubs.model_service_pb2_grpc.ModelServiceStub(channel)

    def version_two_ready() -> bool:
        request = srv.stubs.get_model_status_pb2.GetModelStatusRequest()
        request.model_spec.name = "scale"
        request.model_spec.version.value = 2
        answer = status.GetModelStatus(request, timeout=10)
        return answer.model_version_status[0].state == 30  # AVAILABLE

    wait_for(version_two_ready, 60, "scale version 2 available")
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def stubs(server: TfsServer) -> SimpleNamespace:
    return server.stubs


@pytest.fixture(scope="module")
def channel(server: TfsServer) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(server.grpc_inference) as ch:
        yield ch


@pytest.fixture(scope="module")
def predictor(channel: grpc.Channel, stubs: SimpleNamespace) -> object:
    return stubs.prediction_service_pb2_grpc.PredictionServiceStub(channel)


def float_tensor(stubs: SimpleNamespace, array: np.ndarray, *, content: bool) -> object:
    """A TensorProto as ``tf.make_tensor_proto`` writes it (content) or as typed float_val."""
    proto = stubs.tensor_pb2.TensorProto(dtype=stubs.types_pb2.DT_FLOAT)
    for size in array.shape:
        proto.tensor_shape.dim.add(size=size)
    if content:
        proto.tensor_content = array.astype("<f4").tobytes()
    else:
        proto.float_val.extend(array.reshape(-1).tolist())
    return proto


def predict_request(
    stubs: SimpleNamespace, model: str, array: np.ndarray, **spec: object
) -> object:
    request = stubs.predict_pb2.PredictRequest()
    request.model_spec.name = model
    for key, value in spec.items():
        if key == "version":
            request.model_spec.version.value = value
        else:
            setattr(request.model_spec, key, value)
    request.inputs["x"].CopyFrom(float_tensor(stubs, array, content=True))
    return request


def read_floats(proto: object) -> np.ndarray:
    shape = [d.size for d in proto.tensor_shape.dim]  # type: ignore[attr-defined]
    return np.asarray(proto.float_val, dtype=np.float32).reshape(shape)  # type: ignore[attr-defined]


@pytest.mark.parametrize("content", [True, False], ids=["tensor_content", "float_val"])
def test_predict_equals_onnxruntime(
    server: TfsServer, stubs: SimpleNamespace, predictor: object, content: bool
) -> None:
    x = np.random.default_rng(1).standard_normal((3, 4)).astype(np.float32)
    request = stubs.predict_pb2.PredictRequest()
    request.model_spec.name = "scale"
    request.inputs["x"].CopyFrom(float_tensor(stubs, x, content=content))
    answer = predictor.Predict(request, timeout=30)  # type: ignore[attr-defined]
    # No version: the default one, which is the first registered (Lantern's rule, as TorchServe's)
    want = models.run_onnx(server.scale["1"], {"x": x})[0]
    np.testing.assert_array_equal(read_floats(answer.outputs["y"]), want)
    assert answer.model_spec.name == "scale"
    assert answer.model_spec.version.value == 1
    assert answer.model_spec.signature_name == "serving_default"


def test_version_zero_and_numbered_versions(
    server: TfsServer, stubs: SimpleNamespace, predictor: object
) -> None:
    x = np.ones((1, 4), dtype=np.float32)
    for version, factor in ((1, 2.0), (2, 3.0), (0, 2.0)):  # 0: the default (ovmsclient)
        answer = predictor.Predict(  # type: ignore[attr-defined]
            predict_request(stubs, "scale", x, version=version), timeout=30
        )
        np.testing.assert_array_equal(read_floats(answer.outputs["y"]), x * factor)


def test_every_datatype_round_trips(stubs: SimpleNamespace, predictor: object) -> None:
    request = stubs.predict_pb2.PredictRequest()
    request.model_spec.name = "dtypes"
    dt = stubs.types_pb2
    values = {
        "INT32": (dt.DT_INT32, "int_val", [1, -2, 3, 4]),
        "INT64": (dt.DT_INT64, "int64_val", [2**40, -1, 0, 5]),
        "FP32": (dt.DT_FLOAT, "float_val", [0.5, 1.5, -2.0, 3.25]),
        "FP64": (dt.DT_DOUBLE, "double_val", [0.1, 0.2, 0.3, 0.4]),
        "BOOL": (dt.DT_BOOL, "bool_val", [True, False, False, True]),
        "UINT8": (dt.DT_UINT8, "int_val", [0, 255, 7, 8]),
        "BYTES": (dt.DT_STRING, "string_val", [b"a", b"", "é".encode(), b"dd"]),
        "FP16": (
            dt.DT_HALF,
            "half_val",
            [int(v) for v in np.array([1, 2, -3, 0.5], "<f2").view("<u2")],
        ),
    }
    for name, (dtype, field, data) in values.items():
        proto = request.inputs[f"in_{name}"]
        proto.dtype = dtype
        proto.tensor_shape.dim.add(size=2)
        proto.tensor_shape.dim.add(size=2)
        getattr(proto, field).extend(data)
    answer = predictor.Predict(request, timeout=30)  # type: ignore[attr-defined]
    for name, (dtype, field, data) in values.items():
        out = answer.outputs[f"out_{name}"]
        assert out.dtype == dtype, name
        assert [d.size for d in out.tensor_shape.dim] == [2, 2]
        got = list(getattr(out, field))
        if name in ("FP32", "FP64"):
            assert got == pytest.approx(data), name
        else:
            assert got == data, name


def test_output_filter(stubs: SimpleNamespace, predictor: object) -> None:
    request = stubs.predict_pb2.PredictRequest()
    request.model_spec.name = "scale"
    request.inputs["x"].CopyFrom(float_tensor(stubs, np.ones((1, 4), np.float32), content=False))
    request.output_filter.append("y")
    answer = predictor.Predict(request, timeout=30)  # type: ignore[attr-defined]
    assert list(answer.outputs) == ["y"]
    request.output_filter[:] = ["nope"]
    with pytest.raises(grpc.RpcError) as caught:
        predictor.Predict(request, timeout=30)  # type: ignore[attr-defined]
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "output tensor alias not found in signature: nope" in str(caught.value.details())


def test_get_model_metadata(stubs: SimpleNamespace, predictor: object) -> None:
    request = stubs.get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["signature_def"])
    request.model_spec.name = "scale"
    answer = predictor.GetModelMetadata(request, timeout=30)  # type: ignore[attr-defined]
    signatures = stubs.get_model_metadata_pb2.SignatureDefMap()
    assert answer.metadata["signature_def"].Unpack(signatures)
    sig = signatures.signature_def["serving_default"]
    assert sig.method_name == "tensorflow/serving/predict"
    assert sig.inputs["x"].dtype == stubs.types_pb2.DT_FLOAT
    assert [d.size for d in sig.inputs["x"].tensor_shape.dim] == [-1, 4]
    assert set(sig.outputs) == {"y"}
    assert answer.model_spec.version.value == 1


def test_get_model_status(channel: grpc.Channel, stubs: SimpleNamespace) -> None:
    status = stubs.model_service_pb2_grpc.ModelServiceStub(channel)
    request = stubs.get_model_status_pb2.GetModelStatusRequest()
    request.model_spec.name = "scale"
    answer = status.GetModelStatus(request, timeout=30)
    states = {v.version: v.state for v in answer.model_version_status}
    assert states == {1: 30, 2: 30}  # AVAILABLE
    request.model_spec.name = "nope"
    with pytest.raises(grpc.RpcError) as caught:
        status.GetModelStatus(request, timeout=30)
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND


def test_classify_and_regress(server: TfsServer, stubs: SimpleNamespace, predictor: object) -> None:
    rows = np.array([[1, 2, 3, 4], [4, 3, 2, 1]], dtype=np.float32)
    request = stubs.classification_pb2.ClassificationRequest()
    request.model_spec.name = "scale"
    request.model_spec.version.value = 1
    for row in rows:
        example = request.input.example_list.examples.add()
        example.features.feature["x"].float_list.value.extend(row.tolist())
    answer = predictor.Classify(request, timeout=30)  # type: ignore[attr-defined]
    want = models.run_onnx(server.scale["1"], {"x": rows})[0]
    got = [[(c.label, c.score) for c in entry.classes] for entry in answer.result.classifications]
    assert got == [[(str(j), float(want[i, j])) for j in range(4)] for i in range(2)]

    regress = stubs.regression_pb2.RegressionRequest()
    regress.model_spec.name = "total"
    regress.input.example_list.CopyFrom(request.input.example_list)
    answer = predictor.Regress(regress, timeout=30)  # type: ignore[attr-defined]
    want = models.run_onnx(server.total, {"x": rows})[0]
    assert [r.value for r in answer.result.regressions] == pytest.approx(want[:, 0].tolist())


def test_version_labels_by_reload(
    channel: grpc.Channel, stubs: SimpleNamespace, predictor: object
) -> None:
    service = stubs.model_service_pb2_grpc.ModelServiceStub(channel)
    reload = stubs.model_management_pb2.ReloadConfigRequest()
    entry = reload.config.model_config_list.config.add(name="scale", base_path="/models/scale")
    entry.version_labels["stable"] = 1
    entry.version_labels["canary"] = 2
    service.HandleReloadConfigRequest(reload, timeout=30)
    x = np.ones((1, 4), dtype=np.float32)
    for label, factor in (("stable", 2.0), ("canary", 3.0)):
        answer = predictor.Predict(  # type: ignore[attr-defined]
            predict_request(stubs, "scale", x, version_label=label), timeout=30
        )
        np.testing.assert_array_equal(read_floats(answer.outputs["y"]), x * factor)
        assert answer.model_spec.version.value == int(factor - 1)
    # A label that names a version that is not served is refused, and changes nothing.
    entry.version_labels["stable"] = 7
    with pytest.raises(grpc.RpcError) as caught:
        service.HandleReloadConfigRequest(reload, timeout=30)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    answer = predictor.Predict(  # type: ignore[attr-defined]
        predict_request(stubs, "scale", x, version_label="stable"), timeout=30
    )
    np.testing.assert_array_equal(read_floats(answer.outputs["y"]), x * 2.0)


def test_bad_requests_answer_tf_serving_codes(stubs: SimpleNamespace, predictor: object) -> None:
    x = np.ones((2, 4), dtype=np.float32)
    cases = []
    short = predict_request(stubs, "scale", x)
    short.inputs["x"].tensor_content = short.inputs["x"].tensor_content[:-4]  # type: ignore[attr-defined]
    cases.append((short, grpc.StatusCode.INVALID_ARGUMENT, "tensor_content has 28 bytes"))
    cases.append(
        (
            predict_request(stubs, "scale", x, signature_name="predict"),
            grpc.StatusCode.FAILED_PRECONDITION,
            'Serving signature key "predict" not found.',
        )
    )
    cases.append(
        (
            predict_request(stubs, "scale", x, version_label="nowhere"),
            grpc.StatusCode.INVALID_ARGUMENT,
            "Unrecognized servable version label: nowhere",
        )
    )
    cases.append((predict_request(stubs, "nope", x), grpc.StatusCode.NOT_FOUND, "nope"))
    cases.append((predict_request(stubs, "scale", x, version=9), grpc.StatusCode.NOT_FOUND, "9"))
    for request, code, text in cases:
        with pytest.raises(grpc.RpcError) as caught:
            predictor.Predict(request, timeout=30)  # type: ignore[attr-defined]
        assert caught.value.code() == code, caught.value.details()
        assert text in str(caught.value.details())
    # Nothing else disturbed: the model still answers.
    answer = predictor.Predict(predict_request(stubs, "scale", x), timeout=30)  # type: ignore[attr-defined]
    np.testing.assert_array_equal(read_floats(answer.outputs["y"]), x * 2.0)


def test_reflection_lists_tf_serving(server: TfsServer) -> None:
    with grpc.insecure_channel(server.grpc_inference) as ch:
        services = set(ProtoReflectionDescriptorDatabase(ch).get_services())
    assert {"tensorflow.serving.PredictionService", "tensorflow.serving.ModelService"} <= services
