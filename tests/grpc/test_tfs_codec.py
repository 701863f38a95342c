"""TF Serving's codecs in-process: TensorProto <-> tensors, SignatureDefs, Examples, versions."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from serve.core.version_labels import VersionLabels, find_version, resolve
from serve.grpc.errors import grpc_code_for
from serve.grpc.gen.tensorflow.core.framework import tensor_pb2, types_pb2
from serve.grpc.tfs_codec import tensor_from_proto, tensor_to_proto
from serve.grpc.tfserving import signature_map
from serve.wire.errors import ModelNotFound, ModelVersionNotFound
from serve.wire.tensor_params import Tensor
from serve.wire.tensors import TensorError
from serve.wire.tfserving import (
    Feature,
    LabelNotFound,
    SignatureNotFound,
    check_signature,
    classifications,
    examples_to_tensors,
    metadata_body,
    numeric_version,
    regressions,
)

DT = types_pb2.DataType


def proto(dtype: int, shape: list[int], **fields: Any) -> Any:
    out = tensor_pb2.TensorProto(dtype=dtype)  # type: ignore[arg-type]
    for size in shape:
        out.tensor_shape.dim.add(size=size)
    for name, value in fields.items():
        if name == "tensor_content":
            out.tensor_content = value
        else:
            getattr(out, name).extend(value)
    return out


@pytest.mark.parametrize(
    ("message", "datatype", "want"),
    [
        (proto(DT.DT_FLOAT, [2, 2], float_val=[1, 2, 3, 4]), "FP32", [[1, 2], [3, 4]]),
        (
            proto(DT.DT_FLOAT, [2], tensor_content=np.array([1.5, 2.5], "<f4").tobytes()),
            "FP32",
            [1.5, 2.5],
        ),
        (proto(DT.DT_DOUBLE, [2], double_val=[0.1, 0.2]), "FP64", [0.1, 0.2]),
        (proto(DT.DT_INT32, [3], int_val=[7]), "INT32", [7, 7, 7]),  # one value fills the shape
        (proto(DT.DT_INT64, [3], int64_val=[1, 2]), "INT64", [1, 2, 2]),  # the last is repeated
        (proto(DT.DT_INT64, [2]), "INT64", [0, 0]),  # no values: zeros
        (proto(DT.DT_UINT8, [2], int_val=[0, 255]), "UINT8", [0, 255]),
        (proto(DT.DT_INT8, [2], int_val=[-128, 127]), "INT8", [-128, 127]),
        (proto(DT.DT_UINT32, [1], uint32_val=[2**32 - 1]), "UINT32", [2**32 - 1]),
        (proto(DT.DT_UINT64, [1], uint64_val=[2**64 - 1]), "UINT64", [2**64 - 1]),
        (proto(DT.DT_BOOL, [2], bool_val=[True, False]), "BOOL", [True, False]),
        (
            proto(DT.DT_HALF, [2], half_val=np.array([1, -2], "<f2").view("<u2").tolist()),
            "FP16",
            [1.0, -2.0],
        ),
        (proto(DT.DT_STRING, [2], string_val=[b"a", b"bc"]), "BYTES", [b"a", b"bc"]),
        (proto(DT.DT_FLOAT, [], float_val=[3.0]), "FP32", 3.0),  # a scalar
    ],
)
def test_tensor_from_proto(message: Any, datatype: str, want: Any) -> None:
    tensor = tensor_from_proto("x", message)
    assert tensor.datatype == datatype
    got = tensor.array()
    if datatype.startswith("FP"):
        np.testing.assert_allclose(got, np.asarray(want, dtype=got.dtype))
    else:
        assert got.tolist() == want


@pytest.mark.parametrize(
    ("message", "fragment"),
    [
        (proto(DT.DT_FLOAT, [2, 2], tensor_content=b"\0" * 12), "tensor_content has 12 bytes"),
        (proto(DT.DT_FLOAT, [2, 2], tensor_content=b"\0" * 20), "needs 16"),
        (proto(DT.DT_FLOAT, [1], float_val=[1, 2]), "2 values in float_val do not fit"),
        (proto(DT.DT_INT8, [1], int_val=[300]), "out of range for DT_INT8"),
        (
            proto(DT.DT_COMPLEX64, [1], scomplex_val=[1, 2]),
            "DT_COMPLEX64 tensors are not supported",
        ),
        (proto(DT.DT_STRING, [1], tensor_content=b"abc"), "must be sent in string_val"),
        (proto(DT.DT_FLOAT, [-1, 2]), "unknown (negative) dimension"),
        (proto(DT.DT_HALF, [1], half_val=[70000]), "not a 16-bit pattern"),
    ],
)
def test_malformed_tensor_protos(message: Any, fragment: str) -> None:
    with pytest.raises(TensorError) as caught:
        tensor_from_proto("x", message)
    assert fragment in caught.value.message
    assert grpc_code_for(caught.value) == "INVALID_ARGUMENT"


@pytest.mark.parametrize(
    ("array", "datatype", "field"),
    [
        (np.array([[1.5, 2.0]], np.float32), "FP32", "float_val"),
        (np.array([1, 2], np.int64), "INT64", "int64_val"),
        (np.array([1, 0], np.uint8), "UINT8", "int_val"),
        (np.array([True], np.bool_), "BOOL", "bool_val"),
        (np.array([7], np.uint64), "UINT64", "uint64_val"),
    ],
)
def test_tensor_to_proto_uses_typed_fields(array: np.ndarray, datatype: str, field: str) -> None:
    message = tensor_to_proto(Tensor.from_array("y", array, datatype))
    assert [d.size for d in message.tensor_shape.dim] == list(array.shape)
    assert list(getattr(message, field)) == array.reshape(-1).tolist()
    assert tensor_from_proto("y", message).array().tolist() == array.tolist()  # round trip


def test_strings_round_trip() -> None:
    message = proto(DT.DT_STRING, [2], string_val=[b"\xff", b""])
    assert list(tensor_to_proto(tensor_from_proto("s", message)).string_val) == [b"\xff", b""]


def test_signature_def_from_metadata() -> None:
    metadata = {
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}],
        "outputs": [{"name": "y", "datatype": "INT64", "shape": [-1]}],
    }
    sig = signature_map(metadata).signature_def["serving_default"]
    assert sig.inputs["x"].dtype == DT.DT_FLOAT and sig.inputs["x"].name == "x"
    assert [d.size for d in sig.inputs["x"].tensor_shape.dim] == [-1, 4]
    assert sig.outputs["y"].dtype == DT.DT_INT64
    body = metadata_body("m", "2.0", metadata)
    assert body["model_spec"] == {"name": "m", "signature_name": "", "version": "2"}
    rest = body["metadata"]["signature_def"]["signature_def"]["serving_default"]
    assert rest["inputs"]["x"]["tensor_shape"]["dim"][0]["size"] == "-1"  # int64 as a string


def test_signature_names() -> None:
    assert check_signature("") == check_signature("serving_default") == "serving_default"
    with pytest.raises(SignatureNotFound) as caught:
        check_signature("predict")
    assert grpc_code_for(caught.value) == "FAILED_PRECONDITION"
    assert caught.value.status_code == 400


@pytest.mark.parametrize(
    ("text", "want"), [("1", 1), ("2.0", 2), ("0", 0), ("1.5", None), ("v1", None), ("-1", None)]
)
def test_numeric_version(text: str, want: int | None) -> None:
    assert numeric_version(text) == want


def test_examples_to_tensors_and_answers() -> None:
    examples: list[dict[str, Feature]] = [
        {"x": ("float_list", [1.0, 2.0]), "id": ("int64_list", [5])},
        {"x": ("float_list", [3.0, 4.0]), "id": ("int64_list", [6])},
    ]
    tensors = {t.name: t for t in examples_to_tensors(examples, {"tag": ("bytes_list", [b"t"])})}
    assert tensors["x"].array().tolist() == [[1.0, 2.0], [3.0, 4.0]]
    assert tensors["id"].datatype == "INT64" and tensors["id"].shape == (2, 1)
    assert tensors["tag"].array().tolist() == [[b"t"], [b"t"]]
    scores = Tensor.from_array("y", np.array([[0.1, 0.9], [0.7, 0.3]], np.float32), "FP32")
    got = classifications([scores], 2)
    assert [[label for label, _ in row] for row in got] == [["0", "1"], ["0", "1"]]
    assert got[0][1][1] == pytest.approx(0.9)
    classes = Tensor.from_array("classes", np.array([[b"a", b"b"], [b"a", b"b"]], object), "BYTES")
    named = classifications([Tensor("scores", "FP32", scores.shape, scores.raw), classes], 2)
    assert named[1][0][0] == "a"
    value = Tensor.from_array("value", np.array([[1.5], [2.5]], np.float32), "FP32")
    assert regressions([value], 2) == [1.5, 2.5]


@pytest.mark.parametrize(
    ("examples", "fragment"),
    [
        ([], "Input is empty"),
        ([{"x": ("float_list", [1.0])}, {}], "missing from an example"),
        ([{"x": ("float_list", [1.0])}, {"x": ("int64_list", [1])}], "different kinds"),
        ([{"x": ("float_list", [1.0])}, {"x": ("float_list", [1.0, 2.0])}], "different length"),
    ],
)
def test_bad_examples(examples: list[dict[str, Any]], fragment: str) -> None:
    with pytest.raises(Exception) as caught:
        examples_to_tensors(examples)
    assert fragment in str(caught.value)


class _Version:
    def __init__(self, version: str) -> None:
        self.name, self.version = "m", version


class _Registry:
    """The two lookups version resolution uses, over versions "1.0" (default) and "2"."""

    def __init__(self) -> None:
        self.all = {"1.0": _Version("1.0"), "2": _Version("2")}

    def get(self, name: str, version: str | None = None) -> Any:
        if name != "m":
            raise ModelNotFound(name)
        if not version:
            return self.all["1.0"]
        if version not in self.all:
            raise ModelVersionNotFound(version)
        return self.all[version]

    def versions(self, name: str) -> list[Any]:
        self.get(name)
        return list(self.all.values())


def test_version_resolution_and_labels() -> None:
    registry: Any = _Registry()
    assert find_version(registry, "m", None).version == "1.0"
    assert find_version(registry, "m", "0").version == "1.0"  # OVMS: 0 is the default
    assert find_version(registry, "m", "1").version == "1.0"  # numerically equal
    assert find_version(registry, "m", "2").version == "2"
    with pytest.raises(ModelVersionNotFound):
        find_version(registry, "m", "3")
    labels = VersionLabels()
    labels.assign(registry, "m", {"canary": "2"})
    assert resolve(registry, labels, "m", label="canary").version == "2"
    with pytest.raises(LabelNotFound, match="Unrecognized servable version label: stable"):
        resolve(registry, labels, "m", label="stable")
    with pytest.raises(ModelNotFound):
        resolve(registry, labels, "other", label="canary")
    with pytest.raises(Exception, match="not served"):
        labels.assign(registry, "m", {"canary": "2", "stable": "9"})
    assert labels.of("m") == {"canary": "2"}  # a refused assignment changes nothing
