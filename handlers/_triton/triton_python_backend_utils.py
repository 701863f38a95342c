"""Lantern's ``triton_python_backend_utils`` (``pb_utils``): what a Triton Python backend
``model.py`` uses, backed by numpy, so that it runs unchanged in a Lantern worker.

Covered: `Tensor` (``name``, ``as_numpy``, ``from_dlpack`` for numpy-convertible objects),
`InferenceRequest` (``inputs``, ``requested_output_names``, ``model_name``...),
`InferenceResponse` (``output_tensors``, ``has_error``, ``error``), `TritonError`,
`TritonModelException`, `get_input_tensor_by_name`, `get_output_tensor_by_name`,
`get_input_config_by_name`, `get_output_config_by_name`, `triton_string_to_numpy`,
`numpy_to_triton_string`. Not covered: BLS (``InferenceRequest.exec`` raises `TritonModelException`
saying so), decoupled response senders, GPU tensors (``to_dlpack`` gives numpy's DLPack capsule).
"""

from __future__ import annotations

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
        raise TritonModelException(
            "BLS (InferenceRequest.exec) is not supported by Lantern's Python backend yet; "
            "chain models with a Lantern workflow instead"
        )

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
