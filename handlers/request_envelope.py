"""Request envelopes: wrappers that reshape a batch before a handler sees it and its results after
(TorchServe's ``ts.torch_handler.request_envelope``: ``body``, ``json``, ``kserve``, ``kservev2``).

``service_envelope`` (config.properties, or a model's model-config.yaml) wraps the handler's entry
point in one, as TorchServe's model loader does, for every request the model gets
(``apply_envelope``); the ``/v1`` and ``/v2`` routes then give such a handler the request JSON as
TorchServe does (``serve/worker/protocol_batch.py``). A handler that builds one itself
(``self.handle = JSONEnvelope(self.handle).handle``) works as it does in TorchServe.
"""

from __future__ import annotations

import abc
import json
import logging
from base64 import b64decode
from collections.abc import Callable
from typing import Any

from handlers.exceptions import HandlerLoadError

logger = logging.getLogger(__name__)


def _payload(row: Any) -> Any:
    return row.get("data") or row.get("body")


class BaseEnvelope(abc.ABC):
    """Calls ``handle_fn`` with ``parse_input(data)`` and returns ``format_output(results)``."""

    def __init__(self, handle_fn: Callable[[Any, Any], Any]) -> None:
        self._handle_fn = handle_fn
        self.context: Any = None

    def handle(self, data: Any, context: Any) -> Any:
        self.context = context
        if data:
            data = self.parse_input(data)
        results = self._handle_fn(data, context)
        if results:
            results = self.format_output(results)
        return results

    @abc.abstractmethod
    def parse_input(self, data: Any) -> Any:
        """The batch as the wrapped handler should see it."""

    @abc.abstractmethod
    def format_output(self, data: Any) -> Any:
        """The wrapped handler's results as the client should get them."""


class BodyEnvelope(BaseEnvelope):
    """Each row's ``data`` (or ``body``) as a plain list; results unchanged."""

    def parse_input(self, data: list) -> list:
        return [_payload(row) for row in data]

    def format_output(self, data: Any) -> Any:
        return data


def _unpack_b64(value: Any) -> Any:
    if isinstance(value, dict) and list(value) == ["b64"]:
        return b64decode(value["b64"])
    return value


class JSONEnvelope(BaseEnvelope):
    """TensorFlow-Serving style: ``{"instances": [...]}`` in, ``{"predictions": [...]}`` out.

    The instances of all requests form one list for the handler; the results are cut back into
    one JSON string per request. ``{"b64": ...}`` values are decoded to bytes.
    """

    _lengths: list[int] = []  # on the class, as in TorchServe

    def parse_input(self, data: list) -> list:
        per_request = [self._from_json(row) for row in data]
        self._lengths = [len(rows) for rows in per_request]
        return [row for rows in per_request for row in rows]

    def format_output(self, data: list) -> list[str]:
        outputs, cursor = [], 0
        for length in self._lengths:
            outputs.append(json.dumps({"predictions": data[cursor : cursor + length]}))
            cursor += length
        return outputs

    def _from_json(self, row: Any) -> list:
        document = _payload(row) or row
        if isinstance(document, (bytes, bytearray)):
            document = json.loads(document)
        instances = document["instances"]
        if instances and isinstance(instances[0], dict):
            for i, instance in enumerate(instances):
                if list(instance) == ["b64"]:
                    instances[i] = _unpack_b64(instance)
                else:
                    for key, value in instance.items():
                        instance[key] = _unpack_b64(value)
        return instances


class KServeEnvelope(BaseEnvelope):
    """KServe v1 as TorchServe reads it: the first request's ``instances``; one response.

    Like TorchServe's, only ``data[0]`` is read (Lantern's own ``/v1`` route batches properly).
    """

    def parse_input(self, data: list) -> Any:
        self._data_list = [_payload(row) for row in data]
        first = self._data_list[0]
        if isinstance(first, (bytes, bytearray)):
            first = json.loads(first.decode())
        self._inputs = first.get("instances")
        return self._inputs

    def format_output(self, data: Any) -> list[dict]:
        key = "explanations" if self._is_explain() else "predictions"
        return [{key: data}]

    def _is_explain(self) -> bool:
        return bool(self.context and self.context.get_request_header(0, "explain") == "True")


_V2_TO_NUMPY = {
    "BOOL": "bool",
    "UINT8": "uint8",
    "UINT16": "uint16",
    "UINT32": "uint32",
    "UINT64": "uint64",
    "INT8": "int8",
    "INT16": "int16",
    "INT32": "int32",
    "INT64": "int64",
    "FP16": "float16",
    "FP32": "float32",
    "FP64": "float64",
    "BYTES": "byte",
}
_NUMPY_TO_V2 = {numpy: v2 for v2, numpy in _V2_TO_NUMPY.items()} | {"object": "BYTES", "U": "BYTES"}


def _to_datatype(dtype: Any) -> str:
    name = str(dtype)
    return _NUMPY_TO_V2.get(name) or _NUMPY_TO_V2[dtype.kind]


class KServev2Envelope(BaseEnvelope):
    """KServe v2 (Open Inference Protocol) as TorchServe reads it: the first request's inputs."""

    def parse_input(self, data: list) -> list:
        import numpy as np

        bodies = [_payload(row) for row in data]
        if isinstance(bodies[0], (bytes, bytearray)):
            bodies = [json.loads(body.decode("utf8")) for body in bodies]
        first = bodies[0]
        names = []
        for tensor in first["inputs"]:
            if tensor["datatype"] == "BYTES":
                tensor["data"] = tensor["data"][0]
            else:
                tensor["data"] = np.array(tensor["data"]).reshape(tuple(tensor["shape"])).tolist()
            names.append(tensor["name"])
        self.context.input_names = names
        request_id = first.get("id")
        if request_id and str(request_id).strip():
            self.context.input_request_id = request_id
        return first.get("inputs")

    def format_output(self, data: list) -> list[dict]:
        context = self.context
        if hasattr(context, "input_request_id"):
            response_id = context.input_request_id
            del context.input_request_id
        else:
            response_id = context.get_request_id(0)
        model = (context.manifest or {}).get("model", {})
        names = getattr(context, "input_names", [])
        if hasattr(context, "input_names"):
            del context.input_names
        outputs = [self._to_json(item, names[i]) for i, item in enumerate(data)]
        return [
            {
                "id": response_id,
                "model_name": model.get("modelName"),
                "model_version": model.get("modelVersion"),
                "outputs": outputs,
            }
        ]

    def _to_json(self, data: Any, input_name: str) -> dict:
        import numpy as np

        array = np.array(data).flatten()  # TorchServe sends every output flat
        return {
            "name": input_name,
            "shape": list(array.shape),
            "datatype": _to_datatype(array.dtype),
            "data": array.flatten().tolist(),
        }


ENVELOPES: dict[str, type[BaseEnvelope]] = {
    "body": BodyEnvelope,
    "json": JSONEnvelope,
    "kserve": KServeEnvelope,
    "kservev2": KServev2Envelope,
}


def apply_envelope(service: Any, name: str) -> None:
    """Wrap ``service``'s entry point in the envelope ``name`` (TorchServe's service_envelope)."""
    envelope = ENVELOPES.get(name)
    if envelope is None:
        raise HandlerLoadError(
            f"unknown service_envelope {name!r}; use one of {', '.join(sorted(ENVELOPES))}"
        )
    service.entry_point = envelope(service.entry_point).handle
    service.envelope = name
