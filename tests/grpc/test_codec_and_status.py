"""Pure logic of the gRPC layer: status mapping, OIP message codec, reflection descriptors."""

from __future__ import annotations

import grpc
import numpy as np
import pytest

from serve.grpc.descriptors import kserve_file, pool
from serve.grpc.errors import grpc_code_for, grpc_code_name
from serve.grpc.gen import open_inference_grpc_pb2 as pb
from serve.grpc.oip_codec import request_from_pb, response_to_pb
from serve.wire.errors import (
    BadRequest,
    Conflict,
    Forbidden,
    GatewayTimeout,
    MethodNotAllowed,
    ModelNotFound,
    NoHealthyWorkers,
    PayloadTooLarge,
    ServeError,
    TooManyRequests,
    WorkerError,
)
from serve.wire.tensor_params import Tensor
from serve.wire.tensors import deserialize_bytes, serialize_bytes


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (BadRequest("x"), "INVALID_ARGUMENT"),
        (Forbidden("x"), "PERMISSION_DENIED"),
        (MethodNotAllowed("x"), "PERMISSION_DENIED"),  # the model API is off
        (ModelNotFound("x"), "NOT_FOUND"),
        (Conflict("x"), "ALREADY_EXISTS"),
        (PayloadTooLarge("x"), "RESOURCE_EXHAUSTED"),
        (TooManyRequests("x"), "RESOURCE_EXHAUSTED"),
        (NoHealthyWorkers("x"), "UNAVAILABLE"),
        (GatewayTimeout("x"), "DEADLINE_EXCEEDED"),
        (WorkerError("x"), "INTERNAL"),
        (ServeError("x"), "INTERNAL"),
    ],
)
def test_errors_map_to_grpc_codes(error: ServeError, code: str) -> None:
    assert grpc_code_for(error) == code
    assert hasattr(grpc.StatusCode, code)


@pytest.mark.parametrize(
    ("status", "code"),
    [(200, "OK"), (206, "OK"), (418, "FAILED_PRECONDITION"), (502, "INTERNAL"), (302, "UNKNOWN")],
)
def test_unlisted_statuses_fall_back_by_class(status: int, code: str) -> None:
    assert grpc_code_name(status) == code


def _request(**kwargs) -> pb.ModelInferRequest:
    return pb.ModelInferRequest(model_name="m", **kwargs)


def test_raw_inputs_are_taken_as_they_are() -> None:
    request = _request(id="r1")
    request.inputs.add(name="a", datatype="FP32", shape=[2, 2])
    request.inputs.add(name="s", datatype="BYTES", shape=[2])
    request.raw_input_contents.append(np.arange(4, dtype="<f4").tobytes())
    request.raw_input_contents.append(serialize_bytes([b"x", b"yz"]))
    request.parameters["timeout"].int64_param = 250_000
    request.parameters["mode"].string_param = "fast"
    infer = request_from_pb(request)
    assert infer.id == "r1" and infer.timeout_us == 250_000
    assert infer.parameters == {"timeout": 250_000, "mode": "fast"}
    assert [(t.name, t.datatype, t.shape) for t in infer.inputs] == [
        ("a", "FP32", (2, 2)),
        ("s", "BYTES", (2,)),
    ]
    np.testing.assert_array_equal(infer.inputs[0].array(), np.arange(4).reshape(2, 2))
    assert deserialize_bytes(infer.inputs[1].raw) == [b"x", b"yz"]
    assert infer.outputs is None


@pytest.mark.parametrize(
    ("datatype", "field", "values", "dtype"),
    [
        ("INT8", "int_contents", [-1, 2], "i1"),
        ("UINT16", "uint_contents", [1, 65535], "<u2"),
        ("INT64", "int64_contents", [-(2**40), 3], "<i8"),
        ("UINT64", "uint64_contents", [2**63, 1], "<u8"),
        ("FP64", "fp64_contents", [0.5, -1.25], "<f8"),
        ("BOOL", "bool_contents", [True, False], "?"),
    ],
)
def test_typed_contents_become_raw_tensors(datatype, field, values, dtype) -> None:
    request = _request()
    tensor = request.inputs.add(name="x", datatype=datatype, shape=[2])
    getattr(tensor.contents, field).extend(values)
    raw = request_from_pb(request).inputs[0].raw
    assert np.frombuffer(raw, dtype=dtype).tolist() == values


@pytest.mark.parametrize(
    ("build", "fragment"),
    [
        (lambda r: r.inputs.add(name="x", datatype="FP99", shape=[1]), "invalid datatype"),
        (lambda r: r.inputs.add(name="x", datatype="FP32", shape=[-1]), "negative"),
        (lambda r: r.inputs.add(name="x", datatype="FP16", shape=[1]), "raw_input_contents"),
        (
            lambda r: r.inputs.add(
                name="x", datatype="INT8", shape=[1]
            ).contents.int_contents.append(300),
            "out of range",
        ),
        (lambda r: r.inputs.add(name="x", datatype="FP32", shape=[3]), "do not match"),
        (
            lambda r: (
                r.inputs.add(name="x", datatype="FP32", shape=[1]),
                r.raw_input_contents.append(b"\0\0"),
            ),
            "bytes of FP32",
        ),
        (
            lambda r: (
                r.inputs.add(name="x", datatype="FP32", shape=[1]),
                r.inputs.add(name="y", datatype="FP32", shape=[1]),
                r.raw_input_contents.append(b"\0" * 4),
            ),
            "one per input",
        ),
        (lambda r: r.parameters["shared_memory_region"].string_param, "shared memory"),
    ],
)
def test_bad_requests_are_invalid_argument(build, fragment: str) -> None:
    request = _request()
    build(request)
    if fragment == "shared memory":
        request.parameters["shared_memory_region"].string_param = "r"
    with pytest.raises(BadRequest) as info:
        request_from_pb(request)
    assert fragment in info.value.message


def test_response_answers_raw_outputs_in_the_order_asked() -> None:
    request = _request(id="r2")
    request.inputs.add(name="a", datatype="FP32", shape=[1]).contents.fp32_contents.append(1)
    request.outputs.add(name="second")
    top = request.outputs.add(name="first")
    top.parameters["classification"].int64_param = 1
    infer = request_from_pb(request)
    tensors = [
        Tensor.from_array("first", np.array([[0.1, 0.9]], dtype=np.float32), "FP32"),
        Tensor.from_array("second", np.array([7], dtype=np.int64), "INT64"),
    ]
    response = response_to_pb(pb, infer, "m", "1.0", tensors)
    assert (response.id, response.model_name, response.model_version) == ("r2", "m", "1.0")
    assert [(o.name, o.datatype, list(o.shape)) for o in response.outputs] == [
        ("second", "INT64", [1]),
        ("first", "BYTES", [1, 1]),
    ]
    assert np.frombuffer(response.raw_output_contents[0], "<i8").tolist() == [7]
    assert deserialize_bytes(response.raw_output_contents[1]) == [b"0.900000:1"]
    request.outputs.add(name="missing")
    with pytest.raises(BadRequest):
        response_to_pb(pb, request_from_pb(request), "m", "1.0", tensors)


def test_kserve_descriptor_is_torchserves_under_package_inference() -> None:
    file = kserve_file()
    assert file.package == "inference"
    infer = pool().FindMessageTypeByName("inference.ModelInferRequest")
    inputs = infer.fields_by_name["inputs"].message_type
    assert inputs is not None and inputs.full_name == (
        "inference.ModelInferRequest.InferInputTensor"
    )
    method = (
        pool().FindServiceByName("inference.GRPCInferenceService").methods_by_name["ModelInfer"]
    )
    assert method.output_type.full_name == "inference.ModelInferResponse"
    # Same fields and numbers as TorchServe's message: one wire format for both names.
    ts = pb.ModelInferRequest.DESCRIPTOR
    assert [(f.name, f.number) for f in infer.fields] == [(f.name, f.number) for f in ts.fields]


def test_committed_generated_code_is_current() -> None:
    """``serve/grpc/gen`` is what ``python -m serve.grpc.generate`` makes of the vendored protos."""
    import subprocess
    import sys

    from tests.support.server import REPO

    done = subprocess.run(
        [sys.executable, "-m", "serve.grpc.generate", "--check"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "up to date" in done.stdout


def test_kserve_descriptor_matches_kserves_own_proto(tmp_path) -> None:
    """The served ``inference.GRPCInferenceService`` equals KServe's grpc_predict_v2.proto."""
    import subprocess
    import sys

    from google.protobuf import descriptor_pb2

    from tests.support.server import REPO

    out = tmp_path / "kserve.binpb"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            f"-I{REPO / 'serve' / 'grpc' / 'protos' / 'kserve'}",
            f"--descriptor_set_out={out}",
            "grpc_predict_v2.proto",
        ],
        check=True,
    )
    kserve = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file[0]
    ours = kserve_file()

    def shape(messages) -> list:
        return [
            (
                m.name,
                [(f.name, f.number, f.type, f.label, f.type_name) for f in m.field],
                shape(m.nested_type),
                [o.name for o in m.oneof_decl],
            )
            for m in messages
        ]

    assert kserve.package == ours.package == "inference"
    assert shape(kserve.message_type) == shape(ours.message_type)
    assert [(m.name, m.input_type, m.output_type) for s in kserve.service for m in s.method] == [
        (m.name, m.input_type, m.output_type) for s in ours.service for m in s.method
    ]


def test_tritons_double_and_uint64_parameters_are_read() -> None:
    """tritonclient sends a float as Triton's double_param (field 4), which TorchServe's and
    KServe's OIP protos lack: it is read from the unknown fields, as is uint64_param (5)."""
    import struct

    request = pb.ModelInferRequest(model_name="m")
    double = bytes([4 << 3 | 1]) + struct.pack("<d", 0.25)
    request.parameters["ratio"].MergeFromString(double)
    request.parameters["count"].MergeFromString(bytes([5 << 3 | 0, 7]))
    request.parameters["flag"].bool_param = True
    tensor = request.inputs.add(name="x", datatype="FP32", shape=[1])
    tensor.contents.fp32_contents.append(1.0)
    infer = request_from_pb(request)
    assert infer.parameters == {"ratio": 0.25, "count": 7, "flag": True}


def test_a_parameter_without_any_value_is_refused() -> None:
    request = pb.ModelInferRequest(model_name="m")
    request.parameters["empty"].SetInParent()
    tensor = request.inputs.add(name="x", datatype="FP32", shape=[1])
    tensor.contents.fp32_contents.append(1.0)
    with pytest.raises(BadRequest, match="'empty' has no value"):
        request_from_pb(request)
