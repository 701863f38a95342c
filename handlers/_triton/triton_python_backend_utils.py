"""Lantern's ``triton_python_backend_utils`` (``pb_utils``): what a Triton Python backend
``model.py`` uses, backed by numpy, so that it runs unchanged in a Lantern worker.

Covered: `Tensor` (``name``, ``as_numpy``, ``from_dlpack`` for numpy-convertible objects),
`InferenceRequest` (``inputs``, ``requested_output_names``, ``model_name``...),
`InferenceResponse` (``output_tensors``, ``has_error``, ``error``), `TritonError`,
`TritonModelException`, `get_input_tensor_by_name`, `get_output_tensor_by_name`,
`get_input_config_by_name`, `get_output_config_by_name`, `triton_string_to_numpy`,
`numpy_to_triton_string`, and BLS: ``InferenceRequest.exec()`` runs the request on another model
of the server through its Open Inference Protocol route (JSON over loopback HTTP, the inference
token from the server's key file), so the call takes the registry's batching and workers; an
error answer comes back as the response's error. Not covered: ``async_exec`` concurrency (it
runs the call in turn), decoupled response senders, GPU tensors.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import numpy as np

_TRITON_TO_NUMPY: dict[str, Any] = {
    "TYPE_BOOL": np.bool_,
    "TYPE_UINT8": np.uint8,
    "TYPE_UINT16": np.uint16,
    "TYPE_UINT32": np.uint32,
    "TYPE_UINT64": np.uint64,
    "TYPE_INT8": np.int8,
    "TYPE_INT16": np.int16,
    "TYPE_INT32": np.int32,
    "TYPE_INT64": np.int64,
    "TYPE_FP16": np.float16,
    "TYPE_FP32": np.float32,
    "TYPE_FP64": np.float64,
    "TYPE_STRING": np.object_,
}


# BLS: where the server answers (set by handlers/triton_python.py from the model's config).
_BLS: dict[str, Any] = {}
_BLS_TIMEOUT = 120.0
_OIP_DTYPES = {
    "BOOL": np.bool_,
    "UINT8": np.uint8,
    "UINT16": np.uint16,
    "UINT32": np.uint32,
    "UINT64": np.uint64,
    "INT8": np.int8,
    "INT16": np.int16,
    "INT32": np.int32,
    "INT64": np.int64,
    "FP16": np.float16,
    "FP32": np.float32,
    "FP64": np.float64,
}


def configure_bls(settings: Any) -> None:
    """``{"url": inference address, "key_file": token file or None}``, or None (no BLS)."""
    _BLS.clear()
    if isinstance(settings, dict):
        _BLS.update(settings)


def _inference_token() -> str | None:
    key_file = _BLS.get("key_file")
    if not key_file:
        return None
    try:
        with open(key_file, encoding="utf-8") as f:
            return str(json.load(f)["inference"]["key"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _tensor_json(tensor: Tensor) -> dict[str, Any]:
    array = tensor.as_numpy()
    if array.dtype == object or array.dtype.kind in "SU":
        values = [v.decode() if isinstance(v, bytes) else str(v) for v in array.reshape(-1)]
        return {"name": tensor.name(), "datatype": "BYTES", "shape": list(array.shape),
                "data": values}  # fmt: skip
    datatype = next((k for k, v in _OIP_DTYPES.items() if np.dtype(v) == array.dtype), "FP32")
    return {
        "name": tensor.name(),
        "datatype": datatype,
        "shape": list(array.shape),
        "data": array.reshape(-1).tolist(),
    }


def _tensor_of(output: dict[str, Any]) -> Tensor:
    datatype = str(output.get("datatype", ""))
    shape = [int(d) for d in output.get("shape", [])]
    dtype = _OIP_DTYPES.get(datatype, np.object_)
    array: np.ndarray = np.array(output.get("data", []), dtype=dtype).reshape(shape)
    return Tensor(str(output.get("name", "")), array)


def _error_text(exc: Any) -> str:
    try:
        return str(json.loads(exc.read())["error"])
    except (OSError, ValueError, KeyError, TypeError):
        return f"BLS call failed: HTTP {exc.code}"


class TritonError(Exception):
    """An error a model gives one response (``InferenceResponse(error=...)``)."""

    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6
    CANCELLED = 7

    def __init__(self, message: str, code: int = UNKNOWN) -> None:
        super().__init__(message)
        self._message = message
        self._code = code

    def message(self) -> str:
        return self._message

    def code(self) -> int:
        return self._code


class TritonModelException(Exception):
    """What Triton raises into model code for a failed call."""

    def message(self) -> str:
        return str(self)


class Tensor:
    def __init__(self, name: str, array: Any) -> None:
        self._name = name
        self._array = np.asarray(array)

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        return self._array

    def is_cpu(self) -> bool:
        return True

    def shape(self) -> tuple[int, ...]:
        return tuple(self._array.shape)

    def to_dlpack(self) -> Any:
        return self._array.__dlpack__()

    @staticmethod
    def from_dlpack(name: str, capsule: Any) -> Tensor:
        return Tensor(name, np.from_dlpack(capsule))


class InferenceRequest:
    def __init__(
        self,
        model_name: str = "",
        inputs: list[Tensor] | None = None,
        requested_output_names: list[str] | None = None,
        model_version: int = -1,
        request_id: str = "",
        parameters: dict[str, Any] | str | None = None,
        **_: Any,
    ) -> None:
        self._model_name = model_name
        self._inputs = list(inputs or [])
        self._outputs = list(requested_output_names or [])
        self._model_version = model_version
        self._request_id = request_id
        self._parameters = parameters or {}

    def inputs(self) -> list[Tensor]:
        return self._inputs

    def requested_output_names(self) -> list[str]:
        return self._outputs

    def model_name(self) -> str:
        return self._model_name

    def request_id(self) -> str:
        return self._request_id

    def parameters(self) -> str:
        import json

        params = self._parameters
        return params if isinstance(params, str) else json.dumps(params)

    def is_cancelled(self) -> bool:
        return False

    def exec(self, *args: Any, **kwargs: Any) -> InferenceResponse:
        """BLS: run this request on another model of the server, through its OIP route (and so
        its registry, batching and workers). An error comes back as the response's error."""
        if _BLS.get("url") is None:
            raise TritonModelException("BLS needs the server's inference address; none was given")
        version = "" if self._model_version in (-1, "", None) else str(self._model_version)
        path = f"/v2/models/{self._model_name}" + (f"/versions/{version}" if version else "")
        body: dict[str, Any] = {"inputs": [_tensor_json(t) for t in self._inputs]}
        if self._outputs:
            body["outputs"] = [{"name": name} for name in self._outputs]
        headers = {"Content-Type": "application/json"}
        token = _inference_token()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        request = urllib.request.Request(
            f"{_BLS['url']}{path}/infer", json.dumps(body).encode(), headers, method="POST"
        )
        try:
            with urllib.request.urlopen(request, timeout=_BLS_TIMEOUT) as answer:
                data = json.loads(answer.read())
        except urllib.error.HTTPError as exc:
            return InferenceResponse(error=TritonError(_error_text(exc), TritonError.INTERNAL))
        except (OSError, ValueError) as exc:
            return InferenceResponse(error=TritonError(f"BLS call failed: {exc}"))
        return InferenceResponse(output_tensors=[_tensor_of(o) for o in data.get("outputs", [])])

    async def async_exec(self, *args: Any, **kwargs: Any) -> InferenceResponse:
        return self.exec(*args, **kwargs)


class InferenceResponse:
    def __init__(
        self, output_tensors: list[Tensor] | None = None, error: TritonError | None = None
    ) -> None:
        self._outputs = list(output_tensors or [])
        self._error = error

    def output_tensors(self) -> list[Tensor]:
        return self._outputs

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error


def get_input_tensor_by_name(request: InferenceRequest, name: str) -> Tensor | None:
    return next((t for t in request.inputs() if t.name() == name), None)


def get_output_tensor_by_name(response: InferenceResponse, name: str) -> Tensor | None:
    return next((t for t in response.output_tensors() if t.name() == name), None)


def get_input_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any] | None:
    return next((c for c in model_config.get("input", []) if c.get("name") == name), None)


def get_output_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any] | None:
    return next((c for c in model_config.get("output", []) if c.get("name") == name), None)


def triton_string_to_numpy(triton_type: str) -> Any:
    return _TRITON_TO_NUMPY[triton_type]


def numpy_to_triton_string(dtype: Any) -> str:
    wanted = np.dtype(dtype)
    for name, candidate in _TRITON_TO_NUMPY.items():
        if np.dtype(candidate) == wanted:
            return name
    raise TritonModelException(f"no Triton type for numpy {wanted}")
