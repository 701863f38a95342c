"""Triton's Python backend in a Lantern worker: a version folder's ``model.py`` with
``class TritonPythonModel``, run unchanged.

``initialize(args)`` gets Triton's ``args`` (``model_config`` as JSON, ``model_name``,
``model_version``, ``model_repository``, ``model_instance_kind``...), ``execute(requests)`` one
``pb_utils.InferenceRequest`` per request of the batch and returns one ``InferenceResponse``
each, ``finalize()`` runs when the worker stops. ``import triton_python_backend_utils as pb_utils``
finds Lantern's shim (``handlers/_triton``; what it covers is in its docstring). A response with
an error answers its request alone with 400 and the error's message.
"""

from __future__ import annotations

import atexit
import importlib
import json
import logging
import os
import sys
from typing import Any

from handlers.exceptions import HandlerLoadError, InvalidHandlerOutput, InvalidTensorInput
from handlers.modules import import_file

logger = logging.getLogger(__name__)

SHIM_ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_triton")


class TritonPythonHandler:
    def __init__(self) -> None:
        self.model: Any = None
        self.config: dict[str, Any] = {}

    def initialize(self, context: Any) -> None:
        if SHIM_ROOT not in sys.path:
            sys.path.insert(0, SHIM_ROOT)
        properties = context.system_properties
        model_dir = properties["model_dir"]
        manifest = (context.manifest or {}).get("model", {})
        path = os.path.join(model_dir, manifest.get("serializedFile") or "model.py")
        yaml_config = getattr(context, "model_yaml_config", None) or {}
        self.config = dict(yaml_config.get("tritonConfig") or {"name": context.model_name})
        shim = importlib.import_module("triton_python_backend_utils")
        shim.configure_bls(yaml_config.get("bls"))
        try:
            module = import_file(path, "triton_python_model")
        except Exception as exc:
            raise HandlerLoadError(f"{path}: cannot be imported: {exc!r}") from exc
        cls = getattr(module, "TritonPythonModel", None)
        if cls is None:
            raise HandlerLoadError(f"{path}: defines no class TritonPythonModel")
        self.model = cls()
        gpu_id = properties.get("gpu_id")
        args = {
            "model_config": json.dumps(self.config),
            "model_instance_kind": "GPU" if gpu_id is not None else "CPU",
            "model_instance_name": f"{context.model_name}_0",
            "model_instance_device_id": str(gpu_id or 0),
            "model_repository": os.path.dirname(model_dir),
            "model_version": str(manifest.get("modelVersion", "1")),
            "model_name": context.model_name,
        }
        initialize = getattr(self.model, "initialize", None)
        if callable(initialize):
            try:
                initialize(args)
            except Exception as exc:
                raise HandlerLoadError(f"{path}: initialize raised {exc!r}") from exc
        finalize = getattr(self.model, "finalize", None)
        if callable(finalize):
            atexit.register(finalize)

    def handle(self, data: list[Any], context: Any) -> list[Any]:
        pb_utils = importlib.import_module(
            "triton_python_backend_utils"
        )  # the shim, as model.py has it
        requests = []
        for row in data:
            if not isinstance(row, dict):
                raise InvalidTensorInput("the Python backend serves tensor (v2 / KServe) requests")
            tensors = [pb_utils.Tensor(name, value) for name, value in row.items()]
            requests.append(pb_utils.InferenceRequest(context.model_name, tensors, []))
        responses = self.model.execute(requests)
        if not isinstance(responses, list) or len(responses) != len(requests):
            raise InvalidHandlerOutput(
                f"execute must return one InferenceResponse per request ({len(requests)})"
            )
        results: list[Any] = []
        for index, response in enumerate(responses):
            if response.has_error():
                context.set_response_status(400, response.error().message(), idx=index)
                results.append(response.error().message())
                continue
            results.append({t.name(): t.as_numpy() for t in response.output_tensors()})
        return results
