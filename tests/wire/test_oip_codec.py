"""The OIP codec: datatypes, raw and JSON tensor data, the binary extension, responses, bundles."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest

from serve.wire import oip, tensor_params, tensors
from serve.wire.errors import BadRequest

SAMPLES = {
    "BOOL": np.array([[True, False], [False, True]]),
    "UINT8": np.array([[0, 255], [1, 2]], dtype=np.uint8),
    "UINT16": np.array([[0, 65535], [1, 2]], dtype=np.uint16),
    "UINT32": np.array([[0, 2**32 - 1], [1, 2]], dtype=np.uint32),
    "UINT64": np.array([[0, 2**64 - 1], [1, 2]], dtype=np.uint64),
    "INT8": np.array([[-128, 127], [1, 2]], dtype=np.int8),
    "INT16": np.array([[-32768, 32767], [1, 2]], dtype=np.int16),
    "INT32": np.array([[-(2**31), 2**31 - 1], [1, 2]], dtype=np.int32),
    "INT64": np.array([[-(2**63), 2**63 - 1], [1, 2]], dtype=np.int64),
    "FP16": np.array([[0.5, -1.25], [65504, 0]], dtype=np.float16),
    "FP32": np.array([[0.1, -2.5], [3.25, 1e30]], dtype=np.float32),
    "FP64": np.array([[0.1, -2.5], [3.25, 1e300]], dtype=np.float64),
}


def request(inputs, outputs=None, **extra) -> bytes:
    doc = {"inputs": inputs, **extra}
    if outputs is not None:
        doc["outputs"] = outputs
    return json.dumps(doc).encode()


def binary_request(specs: list[tuple[str, str, np.ndarray]], **extra) -> tuple[bytes, int]:
    """A body the way tritonclient builds it: JSON header, then the raw tensors."""
    raws = [tensors.raw_from_array(a, dt) for _, dt, a in specs]
    header = {
        "inputs": [
            {
                "name": n,
                "datatype": dt,
                "shape": list(a.shape),
                "parameters": {"binary_data_size": len(raw)},
            }
            for (n, dt, a), raw in zip(specs, raws, strict=True)
        ],
        **extra,
    }
    head = json.dumps(header).encode()
    return head + b"".join(raws), len(head)


@pytest.mark.parametrize("datatype", sorted(SAMPLES))
def test_json_nested_and_flat_data_give_the_same_tensor(datatype: str) -> None:
    array = SAMPLES[datatype]
    nested = oip.parse_request(
        request([{"name": "x", "datatype": datatype, "shape": [2, 2], "data": array.tolist()}]),
        None,
    )
    flat = oip.parse_request(
        request(
            [
                {
                    "name": "x",
                    "datatype": datatype,
                    "shape": [2, 2],
                    "data": array.reshape(-1).tolist(),
                }
            ]
        ),
        None,
    )
    got = nested.inputs[0].array()
    assert got.dtype == tensors.NUMPY_DTYPES[datatype]
    np.testing.assert_array_equal(got, array)
    assert (
        bytes(nested.inputs[0].raw)
        == bytes(flat.inputs[0].raw)
        == array.astype(tensors.NUMPY_DTYPES[datatype]).tobytes()
    )


@pytest.mark.parametrize("datatype", sorted(SAMPLES))
def test_binary_inputs_are_length_checked_and_kept_raw(datatype: str) -> None:
    array = SAMPLES[datatype]
    body, length = binary_request([("x", datatype, array)])
    parsed = oip.parse_request(body, length)
    np.testing.assert_array_equal(parsed.inputs[0].array(), array)
    assert parsed.inputs[0].shape == (2, 2)


def test_bytes_tensors_in_json_and_binary() -> None:
    words = np.array([b"caf\xc3\xa9", b"", b"\x00\xff"], dtype=object)
    raw = tensors.serialize_bytes(words)
    assert raw[:4] == struct.pack("<I", 5)
    body, length = binary_request([("s", "BYTES", words)])
    parsed = oip.parse_request(body, length)
    assert parsed.inputs[0].array().tolist() == [b"caf\xc3\xa9", b"", b"\x00\xff"]
    text = oip.parse_request(
        request([{"name": "s", "datatype": "BYTES", "shape": [2], "data": ["café", "x"]}]), None
    )
    assert text.inputs[0].array().tolist() == ["café".encode(), b"x"]


def test_bf16_travels_as_bits_and_has_no_json_form() -> None:
    values = np.array([1.0, -2.5, 3.140625], dtype=np.float32)
    bits = tensors.float32_to_bf16(values)
    np.testing.assert_array_equal(tensors.bf16_to_float32(bits), values)
    body, length = binary_request([("b", "BF16", bits)])
    parsed = oip.parse_request(body, length)
    assert tensors.json_from_array(parsed.inputs[0].array(), "BF16") == [1.0, -2.5, 3.140625]
    with pytest.raises(BadRequest, match="BF16 data must be sent as binary"):
        oip.parse_request(
            request([{"name": "b", "datatype": "BF16", "shape": [1], "data": [1.0]}]), None
        )


def test_request_fields_are_kept() -> None:
    parsed = oip.parse_request(
        request(
            [{"name": "x", "datatype": "INT32", "shape": [1], "data": [7]}],
            [{"name": "y", "parameters": {"binary_data": True}}, {"name": "z"}],
            id="req-1",
            parameters={"binary_data_output": True, "timeout": 2_000_000, "custom": "v"},
        ),
        None,
    )
    assert parsed.id == "req-1"
    assert parsed.binary_output is True
    assert parsed.timeout_us == 2_000_000
    assert parsed.parameters == {"timeout": 2_000_000, "custom": "v"}
    assert parsed.output_names == ["y", "z"]
    assert parsed.outputs is not None
    assert parsed.outputs[0].binary is True and parsed.outputs[1].binary is None


@pytest.mark.parametrize(
    ("inputs", "message"),
    [
        ([{"name": "x", "datatype": "FP33", "shape": [1], "data": [1]}], "invalid datatype"),
        ([{"name": "x", "datatype": "FP32", "shape": [2], "data": [1]}], "do not match shape"),
        ([{"name": "x", "datatype": "FP32", "shape": [-1], "data": [1]}], "invalid shape"),
        ([{"name": "x", "datatype": "FP32", "shape": "2", "data": [1]}], "invalid shape"),
        ([{"name": "x", "datatype": "INT8", "shape": [1], "data": [300]}], "out of range"),
        ([{"name": "x", "datatype": "INT32", "shape": [1], "data": [1.5]}], "JSON integers"),
        ([{"name": "x", "datatype": "BOOL", "shape": [1], "data": [1]}], "JSON booleans"),
        ([{"name": "x", "datatype": "FP32", "shape": [1], "data": ["a"]}], "JSON numbers"),
        ([{"name": "x", "datatype": "BYTES", "shape": [1], "data": [1]}], "JSON strings"),
        ([{"name": "x", "datatype": "FP32", "shape": [1]}], "neither 'data'"),
        ([{"datatype": "FP32", "shape": [1], "data": [1]}], "'name'"),
        ([{"name": "x", "datatype": "FP32", "shape": [1], "data": [1]}] * 2, "more than once"),
        (
            [
                {
                    "name": "x",
                    "datatype": "FP32",
                    "shape": [1],
                    "data": [1],
                    "parameters": {"shared_memory_region": "r"},
                }
            ],
            "shared memory",
        ),
    ],
)
def test_bad_inputs_are_400(inputs: list, message: str) -> None:
    with pytest.raises(BadRequest, match=message):
        oip.parse_request(request(inputs), None)


def test_bad_documents_are_400() -> None:
    for body, message in [
        (b"{not json", "failed to parse"),
        (b"[1]", "JSON object"),
        (b"{}", "'inputs' list"),
        (json.dumps({"inputs": [], "id": 5}).encode(), "'id' must be a string"),
        (
            json.dumps({"inputs": [], "outputs": [{"name": "a"}, {"name": "a"}]}).encode(),
            "more than once",
        ),
        (
            json.dumps({"inputs": [], "parameters": {"binary_data_output": "yes"}}).encode(),
            "binary_data_output",
        ),
    ]:
        with pytest.raises(BadRequest, match=message):
            oip.parse_request(body, None)


def test_binary_extension_errors() -> None:
    array = np.zeros((2, 2), dtype=np.float32)
    body, length = binary_request([("x", "FP32", array)])
    with pytest.raises(BadRequest, match="no input claims"):
        oip.parse_request(body + b"extra", length)
    with pytest.raises(BadRequest, match="runs past the end"):
        oip.parse_request(body[:-1], length)
    with pytest.raises(BadRequest, match="no Inference-Header-Content-Length"):
        oip.parse_request(body[:length], None)
    short, short_length = binary_request([("x", "FP32", array[:1])])
    doc = json.loads(short[:short_length])
    doc["inputs"][0]["shape"] = [2, 2]
    head = json.dumps(doc).encode()
    with pytest.raises(BadRequest, match="do not match shape"):
        oip.parse_request(head + short[short_length:], len(head))
    with pytest.raises(BadRequest, match="does not fit"):
        oip.header_length(str(len(body) + 1), len(body))
    with pytest.raises(BadRequest, match="must be an integer"):
        oip.header_length("ten", len(body))
    lying = np.array([b"abc"], dtype=object)
    body, length = binary_request([("s", "BYTES", lying)])
    doc = json.loads(body[:length])
    head = json.dumps(doc).encode()
    raw = struct.pack("<I", 10) + b"abc"  # the element claims 10 bytes, 3 follow
    with pytest.raises(BadRequest, match="ends inside an element"):
        oip.parse_request(head + raw, len(head))


def _tensor(name: str, array: np.ndarray) -> tensor_params.Tensor:
    return tensor_params.Tensor.from_array(name, array, tensors.datatype_of(array))


def test_response_json_and_binary_outputs() -> None:
    parsed = oip.parse_request(
        request(
            [{"name": "x", "datatype": "INT32", "shape": [1], "data": [1]}],
            [{"name": "b", "parameters": {"binary_data": True}}, {"name": "a"}],
            id="42",
        ),
        None,
    )
    a = np.array([[1.5, 2.5]], dtype=np.float32)
    b = np.array([[True, False]])
    body, headers = oip.build_response(parsed, "m", "2.0", [_tensor("a", a), _tensor("b", b)])
    length = int(headers[oip.HEADER_LENGTH])
    doc = json.loads(body[:length])
    assert doc["model_name"] == "m" and doc["model_version"] == "2.0" and doc["id"] == "42"
    assert [o["name"] for o in doc["outputs"]] == ["b", "a"]  # in the order requested
    assert doc["outputs"][0]["parameters"] == {"binary_data_size": 2}
    assert body[length:] == b"\x01\x00"
    assert doc["outputs"][1] == {
        "name": "a",
        "datatype": "FP32",
        "shape": [1, 2],
        "data": [1.5, 2.5],
    }
    with pytest.raises(BadRequest, match="unexpected inference output 'c'"):
        bad = oip.parse_request(request([], [{"name": "c"}]), None)
        oip.build_response(bad, "m", "1", [_tensor("a", a)])


def test_response_all_outputs_by_default_and_binary_data_output() -> None:
    parsed = oip.parse_request(request([], parameters={"binary_data_output": True}), None)
    a = np.arange(3, dtype=np.int64)
    body, headers = oip.build_response(parsed, "m", "1", [_tensor("a", a)])
    assert headers["content-type"] == "application/octet-stream"
    length = int(headers[oip.HEADER_LENGTH])
    assert np.frombuffer(body[length:], dtype="<i8").tolist() == [0, 1, 2]
    plain = oip.parse_request(request([]), None)
    body, headers = oip.build_response(plain, "m", "1", [_tensor("a", a)])
    assert headers == {"content-type": "application/json"}
    assert json.loads(body)["outputs"][0]["data"] == [0, 1, 2]
    assert "id" not in json.loads(body)


def test_classification_extension() -> None:
    parsed = oip.parse_request(
        request([], [{"name": "p", "parameters": {"classification": 2}}]), None
    )
    probs = np.array([[0.1, 0.7, 0.2], [0.5, 0.2, 0.3]], dtype=np.float32)
    body, _ = oip.build_response(parsed, "m", "1", [_tensor("p", probs)])
    out = json.loads(body)["outputs"][0]
    assert out["datatype"] == "BYTES" and out["shape"] == [2, 2]
    assert out["data"] == ["0.700000:1", "0.200000:2", "0.500000:0", "0.300000:2"]


def test_bundles_and_tensor_params_round_trip() -> None:
    items = [
        _tensor("a", SAMPLES["FP16"]),
        tensor_params.Tensor.from_array("s", np.array([b"x", b"yz"], dtype=object), "BYTES"),
    ]
    body, content_type = tensor_params.encode_bundle(items)
    assert tensor_params.is_bundle(content_type)
    back = tensor_params.decode_bundle(body, content_type)
    assert [(t.name, t.datatype, t.shape) for t in back] == [
        ("a", "FP16", (2, 2)),
        ("s", "BYTES", (2,)),
    ]
    np.testing.assert_array_equal(back[0].array(), SAMPLES["FP16"])
    assert back[1].array().tolist() == [b"x", b"yz"]
    ct = tensor_params.tensor_content_type("INT64", (3, 1))
    assert tensor_params.is_tensor_param(ct)
    t = tensor_params.tensor_from_param("n", ct, np.arange(3, dtype="<i8").tobytes())
    assert t.array().reshape(-1).tolist() == [0, 1, 2]
    with pytest.raises(BadRequest, match="do not match shape"):
        tensor_params.tensor_from_param("n", ct, b"\x00" * 7)
    with pytest.raises(BadRequest, match="invalid datatype"):
        tensor_params.tensor_from_param("n", "application/x-lantern-tensor; shape=1", b"\x00")
