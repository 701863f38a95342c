"""TF Serving's contract beside the tensors Lantern serves (sans-IO, shared by REST and gRPC).

A Lantern model has one signature, ``serving_default``, a predict method whose inputs and outputs
are the model's own (``model_metadata``: OIP ``{"name", "datatype", "shape"}`` entries). This
module renders that as TF Serving's ``SignatureDef`` (REST JSON; the gRPC edge builds the same
message), names TF Serving's errors (each with the gRPC code TF Serving answers it with), and
holds TF Serving's version rules: versions are integers, ``0`` (which OVMS's ``ovmsclient`` sends)
and none mean the default version.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

import numpy as np

from serve.wire.errors import BadRequest
from serve.wire.json_input import parse_json
from serve.wire.tensor_params import Tensor
from serve.wire.tensors import NUMPY_DTYPES, serialize_bytes

DEFAULT_SIGNATURE = "serving_default"
PREDICT_METHOD = "tensorflow/serving/predict"
CLASSIFY_METHOD = "tensorflow/serving/classify"
REGRESS_METHOD = "tensorflow/serving/regress"

# OIP datatype -> TensorFlow DataType name.
DT_NAMES = {
    "FP32": "DT_FLOAT",
    "FP64": "DT_DOUBLE",
    "INT32": "DT_INT32",
    "INT16": "DT_INT16",
    "INT8": "DT_INT8",
    "UINT8": "DT_UINT8",
    "UINT16": "DT_UINT16",
    "UINT32": "DT_UINT32",
    "UINT64": "DT_UINT64",
    "INT64": "DT_INT64",
    "BOOL": "DT_BOOL",
    "FP16": "DT_HALF",
    "BF16": "DT_BFLOAT16",
    "BYTES": "DT_STRING",
}


class SignatureNotFound(BadRequest):
    """A ``signature_name`` the model does not have (TF Serving: FAILED_PRECONDITION)."""

    grpc_code = "FAILED_PRECONDITION"


class LabelNotFound(BadRequest):
    """A version label that names no version of the model (TF Serving: INVALID_ARGUMENT)."""


def check_signature(name: str) -> str:
    """The signature a request asks for: ``serving_default`` when it names none."""
    chosen = name or DEFAULT_SIGNATURE
    if chosen != DEFAULT_SIGNATURE:
        raise SignatureNotFound(f'Serving signature key "{chosen}" not found.')
    return chosen


def numeric_version(version: str) -> int | None:
    """A Lantern version string as TF Serving's integer version (``"2"``, ``"2.0"``), or None."""
    try:
        number = float(version)
    except ValueError:
        return None
    return int(number) if number.is_integer() and number >= 0 else None


def tensor_info(entry: dict[str, Any]) -> dict[str, Any]:
    """One OIP metadata entry as a ``TensorInfo`` (proto3 JSON: int64 sizes are strings)."""
    shape = entry.get("shape")
    if isinstance(shape, list):
        dims = {"dim": [{"size": str(int(d)), "name": ""} for d in shape], "unknown_rank": False}
    else:
        dims = {"dim": [], "unknown_rank": True}
    return {
        "dtype": DT_NAMES.get(str(entry.get("datatype", "")), "DT_INVALID"),
        "name": str(entry.get("name", "")),
        "tensor_shape": dims,
    }


def signature_def(metadata: dict[str, Any]) -> dict[str, Any]:
    """The model's one signature as TF Serving's ``SignatureDef`` JSON."""
    return {
        "inputs": {str(e.get("name")): tensor_info(e) for e in metadata.get("inputs") or []},
        "outputs": {str(e.get("name")): tensor_info(e) for e in metadata.get("outputs") or []},
        "method_name": PREDICT_METHOD,
        "defaults": {},
    }


def _camel_signature(sig: dict[str, Any]) -> dict[str, Any]:
    """``sig``'s field names in proto3 JSON's camelCase (map keys, the tensor names, kept)."""

    def info(value: dict[str, Any]) -> dict[str, Any]:
        shape = value["tensor_shape"]
        return {
            "dtype": value["dtype"],
            "name": value["name"],
            "tensorShape": {"dim": shape["dim"], "unknownRank": shape["unknown_rank"]},
        }

    return {
        "inputs": {k: info(v) for k, v in sig["inputs"].items()},
        "outputs": {k: info(v) for k, v in sig["outputs"].items()},
        "methodName": sig["method_name"],
        "defaults": {},
    }


def metadata_body(name: str, version: str, metadata: dict[str, Any]) -> dict[str, Any]:
    """``GET /v1/models/{m}/metadata``: TF Serving's answer (snake_case field names, as TF
    Serving prints them), with OVMS's camelCase names beside them (``modelSpec``,
    ``signatureDef``, ``tensorShape``: what OVMS answers and ``ovmsclient`` reads)."""
    number = numeric_version(version)
    spec = {
        "name": name,
        "signature_name": "",
        "version": str(number) if number is not None else version,
    }
    sig = signature_def(metadata)
    return {
        "model_spec": spec,
        "modelSpec": {"name": name, "signatureName": "", "version": spec["version"]},
        "metadata": {
            "signature_def": {
                "signature_def": {DEFAULT_SIGNATURE: sig},
                "signatureDef": {DEFAULT_SIGNATURE: _camel_signature(sig)},
            }
        },
    }


# ----- Classify and Regress: tf.Examples in, classes or values out ------------------------------

# A feature's kind -> the datatype of its tensor.
FEATURE_DATATYPES = {"float_list": "FP32", "int64_list": "INT64", "bytes_list": "BYTES"}
Feature = tuple[str, list[Any]]  # (kind, values): ("float_list", [1.0, 2.0])


def examples_to_tensors(
    examples: list[dict[str, Feature]], context: dict[str, Feature] | None = None
) -> list[Tensor]:
    """Examples as one input tensor per feature, ``[examples, values]``; Lantern's mapping of
    TF Serving's Classify and Regress onto a model's named inputs. ``context`` features are
    added to every example (TF Serving's ``ExampleListWithContext``)."""
    if not examples:
        raise BadRequest("Input is empty.")
    rows = [{**(context or {}), **example} for example in examples]
    names = sorted(rows[0])
    if not names:
        raise BadRequest("an example has no features")
    tensors: list[Tensor] = []
    for name in names:
        kinds = set()
        values: list[list[Any]] = []
        for row in rows:
            if name not in row:
                raise BadRequest(f"feature '{name}' is missing from an example")
            kind, items = row[name]
            kinds.add(kind)
            values.append(list(items))
        if len(kinds) != 1:
            raise BadRequest(f"feature '{name}' has different kinds across examples")
        width = {len(v) for v in values}
        if len(width) != 1:
            raise BadRequest(f"feature '{name}' has a different length in some examples")
        datatype = FEATURE_DATATYPES[kinds.pop()]
        shape = (len(rows), width.pop())
        if datatype == "BYTES":
            raw = serialize_bytes([v for row_values in values for v in row_values])
            tensors.append(Tensor(name, datatype, shape, raw))
        else:
            array = np.asarray(values, dtype=NUMPY_DTYPES[datatype]).reshape(shape)
            tensors.append(Tensor.from_array(name, array, datatype))
    return tensors


def _float_output(tensors: list[Tensor], names: tuple[str, ...], count: int, what: str) -> Any:
    """The model's answer for ``what``: the output named one of ``names``, else its only
    floating-point output; as a float array of ``count`` rows."""
    by_name = {t.name: t for t in tensors}
    chosen = next((by_name[n] for n in names if n in by_name), None)
    if chosen is None:
        floats = [t for t in tensors if t.datatype in ("FP16", "FP32", "FP64")]
        if len(floats) != 1:
            raise BadRequest(
                f"the model's outputs ({', '.join(sorted(by_name))}) give no single answer to "
                f"{what}: name one of them {' or '.join(repr(n) for n in names)}"
            )
        chosen = floats[0]
    array = np.asarray(chosen.array(), dtype=np.float64)
    if not array.shape or array.shape[0] != count:
        raise BadRequest(f"output '{chosen.name}' has no row for each of the {count} examples")
    return array.reshape(count, -1)


def classifications(tensors: list[Tensor], count: int) -> list[list[tuple[str, float]]]:
    """Per example, its ``(label, score)`` pairs: from ``scores`` (and ``classes``, when the
    model answers labels) or the model's only floating-point output, labelled by index."""
    scores = _float_output(tensors, ("scores",), count, "Classify")
    by_name = {t.name: t for t in tensors}
    labels: list[list[str]]
    if "classes" in by_name:
        flat = [
            v.decode(errors="replace") if isinstance(v, (bytes, bytearray)) else str(v)
            for v in by_name["classes"].array().reshape(-1).tolist()
        ]
        if len(flat) != scores.size:
            raise BadRequest("outputs 'classes' and 'scores' do not have the same size")
        width = scores.shape[1]
        labels = [flat[i * width : (i + 1) * width] for i in range(count)]
    else:
        labels = [[str(j) for j in range(scores.shape[1])] for _ in range(count)]
    return [
        [(label, float(score)) for label, score in zip(labels[i], scores[i], strict=True)]
        for i in range(count)
    ]


def regressions(tensors: list[Tensor], count: int) -> list[float]:
    """Per example, its value: the ``outputs``/``value`` output or the only float output, one
    value per example."""
    values = _float_output(tensors, ("outputs", "value"), count, "Regress")
    if values.shape[1] != 1:
        raise BadRequest("a regression answers one value per example; the output has more")
    return [float(v) for v in values[:, 0]]


# ----- REST bodies ------------------------------------------------------------------------------


def _json_feature(name: str, value: Any) -> Feature:
    """One REST example feature: numbers (int64 when all are integers), strings or b64 bytes."""
    items = value if isinstance(value, list) else [value]
    if not items:
        raise BadRequest(f"feature '{name}' has no values")
    if all(isinstance(v, dict) and set(v) == {"b64"} for v in items):
        try:
            return "bytes_list", [base64.b64decode(str(v["b64"]), validate=True) for v in items]
        except (binascii.Error, ValueError):
            raise BadRequest(f"feature '{name}': invalid base64 in a b64 value") from None
    if all(isinstance(v, str) for v in items):
        return "bytes_list", [v.encode() for v in items]
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in items):
        if all(isinstance(v, int) for v in items):
            return "int64_list", items
        return "float_list", [float(v) for v in items]
    raise BadRequest(f"feature '{name}' must hold numbers, strings or b64 objects, all alike")


def _json_example(value: Any, what: str) -> dict[str, Feature]:
    if not isinstance(value, dict):
        raise BadRequest(f"{what} must be a JSON object of features")
    return {str(k): _json_feature(str(k), v) for k, v in value.items()}


def parse_examples(body: bytes) -> tuple[str, list[dict[str, Feature]], dict[str, Feature] | None]:
    """A REST ``:classify``/``:regress`` body: its signature, examples and context."""
    doc = parse_json(body)
    if not isinstance(doc, dict):
        raise BadRequest("the request must be a JSON object with 'examples'")
    signature = doc.get("signature_name", "")
    if not isinstance(signature, str):
        raise BadRequest("'signature_name' must be a string")
    examples = doc.get("examples")
    if not isinstance(examples, list) or not examples:
        raise BadRequest("'examples' must be a non-empty list")
    context = doc.get("context")
    return (
        signature,
        [_json_example(e, "an example") for e in examples],
        _json_example(context, "'context'") if context is not None else None,
    )
