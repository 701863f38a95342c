"""``BaseHandler``: TorchServe's default handler contract (``ts.torch_handler.base_handler``).

``initialize`` loads the model named by the manifest (TorchScript ``.pt``, eager ``model.py`` +
state dict, ONNX, ``torch.export`` ``.pt2``), then ``handle`` runs describe, explain, or
preprocess -> inference -> postprocess on a batch and leaves per-phase seconds in
``context.handler_timings``.

Deviations from TorchServe 0.12:

* A ``.pt`` that is not TorchScript falls back to eager loading when a model file is present
  (TorchServe picks eager whenever a model file is present, whatever the serialized file is).
* ``.pt2`` (``torch.export``) is supported; AOTInductor ``.so``, XLA/XPU/MPS devices, IPEX and
  the ``ENABLE_TORCH_PROFILER`` switch are not.
* State dicts load with ``weights_only=True``; the model class must subclass ``nn.Module``.
* ``num_threads`` from the context caps torch and onnxruntime threads (TorchServe gives ORT every
  logical CPU in every worker).
* ``preprocess`` unwraps request rows (``{"data": ...}`` / ``{"body": ...}``) before
  ``torch.as_tensor``; TorchServe hands the dicts to ``as_tensor``, which always fails.
* Explanations use a built-in Integrated Gradients (no captum); handlers without
  ``get_insights`` answer 501.
"""

from __future__ import annotations

import abc
import logging
import os
import time
from typing import Any

import torch

from handlers import runtimes
from handlers.context import Context
from handlers.exceptions import HandlerLoadError, PredictionException
from handlers.labels import LABEL_FILE, load_label_mapping
from handlers.timer import timed

logger = logging.getLogger(__name__)


def _row_payload(row: Any) -> Any:
    """A request row's input: ``row["data"]`` or ``row["body"]`` for request dicts, else the row."""
    if isinstance(row, dict) and ("data" in row or "body" in row):
        value = row.get("data")
        return value if value is not None else row.get("body")
    return row


class BaseHandler(abc.ABC):  # noqa: B024  (abstract in name only, exactly like TorchServe's)
    """Loads a model from the manifest and serves batches through pre/inference/postprocess."""

    def __init__(self) -> None:
        self.model: Any = None
        self.mapping: dict[str, str] | None = None
        self.device: torch.device | None = None
        self.initialized = False
        self.context: Context | None = None
        self.model_pt_path: str | None = None
        self.manifest: dict | None = None
        self.map_location: str | None = None
        self.explain = False
        self.target = 0
        self.profiler_args: dict = {}
        self.model_yaml_config: dict = {}

    # -- loading --------------------------------------------------------------------------------

    def initialize(self, context: Context) -> None:
        """Pick the device, load the model and the optional ``index_to_name.json``."""
        self.context = context
        self.model_yaml_config = getattr(context, "model_yaml_config", None) or {}
        properties = context.system_properties
        gpu_id = properties.get("gpu_id")
        num_threads = properties.get("num_threads")
        self.device = runtimes.select_device(gpu_id)
        self.map_location = self.device.type
        runtimes.set_num_threads(num_threads)

        self.manifest = context.manifest
        model_dir: str = properties["model_dir"]  # always set by Context
        model_info = (self.manifest or {}).get("model", {})
        serialized_file = model_info.get("serializedFile")
        self.model_pt_path = os.path.join(model_dir, serialized_file) if serialized_file else None
        model_file = model_info.get("modelFile") or ""

        self.model = self._load_model(model_dir, model_file, self.model_pt_path)
        self.model = runtimes.maybe_compile(self.model, self.model_yaml_config)
        logger.debug("Model file %s loaded successfully", self.model_pt_path)

        self.mapping = load_label_mapping(os.path.join(model_dir, LABEL_FILE))
        self.initialized = True

    def _load_model(self, model_dir: str, model_file: str, model_pt_path: str | None) -> Any:
        if model_pt_path and os.path.isfile(os.path.join(model_pt_path, "saved_model.pb")):
            from handlers.savedmodel import load_savedmodel  # TensorFlow: only when asked for

            properties = self.context.system_properties if self.context else {}
            return load_savedmodel(model_pt_path, properties.get("num_threads"))
        if model_pt_path and model_pt_path.endswith(".onnx"):
            return self._load_onnx_model(model_pt_path)
        if model_pt_path and model_pt_path.endswith(".pt2"):
            return self._load_torch_export_model(model_pt_path)
        if model_pt_path and model_pt_path.endswith(".xml"):
            return self._load_openvino_model(model_pt_path)
        if model_pt_path and model_pt_path.endswith(".pt"):
            try:
                model = self._load_torchscript_model(model_pt_path)
            except Exception as exc:
                if not model_file:
                    raise HandlerLoadError(
                        f"{os.path.basename(model_pt_path)} is not a TorchScript archive ({exc}); "
                        "an eager state dict also needs a model file (--model-file)"
                    ) from exc
                logger.info(
                    "%s is not TorchScript; loading it as an eager state dict", model_pt_path
                )
            else:
                if hasattr(model, "eval"):
                    model.eval()  # as TorchServe, after any _load_torchscript_model
                return model
        if model_file:
            # Whatever loader ran (a handler may override this one), the model ends up on the
            # device in eval mode, as TorchServe's BaseHandler.initialize does.
            model = self._load_pickled_model(model_dir, model_file, model_pt_path)
            return _placed_for_inference(model, self.device)
        if model_pt_path is None:
            raise HandlerLoadError("the manifest names neither a serializedFile nor a modelFile")
        raise HandlerLoadError(
            f"cannot load {os.path.basename(model_pt_path)}: expected TorchScript .pt, ONNX "
            ".onnx, torch.export .pt2, or a state dict together with a model file"
        )

    def _load_torchscript_model(self, model_pt_path: str) -> Any:
        """TorchScript via ``torch.jit.load`` onto this handler's device."""
        return runtimes.load_torchscript(model_pt_path, self.device)

    def _load_pickled_model(
        self, model_dir: str, model_file: str, model_pt_path: str | None
    ) -> Any:
        """Eager model: the one ``nn.Module`` class in ``model_file`` plus its state dict."""
        return runtimes.load_eager(model_dir, model_file, model_pt_path, self.device)

    def _load_onnx_model(self, model_pt_path: str) -> Any:
        properties = self.context.system_properties if self.context else {}
        on_cuda = self.device is not None and self.device.type == "cuda"
        gpu_id = properties.get("gpu_id") if on_cuda else None
        return runtimes.load_onnx(model_pt_path, gpu_id, properties.get("num_threads"))

    def _load_openvino_model(self, model_pt_path: str) -> Any:
        """An IR compiled by OpenVINO: ``openvino: {device, plugin_config}`` in the model config
        (OVMS's ``target_device`` and ``plugin_config`` land there), CPU by default."""
        options = self.model_yaml_config.get("openvino") or {}
        properties = self.context.system_properties if self.context else {}
        return runtimes.load_openvino(
            model_pt_path,
            options.get("device"),
            options.get("plugin_config"),
            properties.get("num_threads"),
            batch_size=options.get("batch_size"),
            shape=options.get("shape"),
        )

    def _load_torch_export_model(self, model_pt_path: str) -> Any:
        return runtimes.load_exported(model_pt_path, self.device)

    # -- the three phases -----------------------------------------------------------------------

    @timed
    def preprocess(self, data: list) -> Any:
        """The batch's inputs in the form this handler's ``inference`` takes: here one tensor
        (``torch.as_tensor``); subclasses return what their models take (a list, a tuple)."""
        return torch.as_tensor([_row_payload(row) for row in data], device=self.device)

    @timed
    def inference(self, data: Any, *args: Any, **kwargs: Any) -> Any:
        """Run the model under ``torch.inference_mode`` (ONNX: numpy in, tensors out)."""
        with torch.inference_mode():
            if isinstance(self.model, runtimes.OnnxModel):
                return self.model(data, *args, **kwargs)
            marshalled_data = data.to(self.device)
            return self.model(marshalled_data, *args, **kwargs)

    @timed
    def postprocess(self, data: Any) -> list:
        """One result per batch row (``tensor.tolist()``)."""
        return data.tolist()

    # -- entry point ----------------------------------------------------------------------------

    def handle(self, data: list, context: Context) -> list:
        """Serve one batch: describe, explain, or preprocess -> inference -> postprocess."""
        start = time.perf_counter()
        self.context = context
        timings: dict[str, float] = {}
        context.handler_timings = timings

        if self._is_describe():
            output = [self.describe_handle()]
        else:
            mark = time.perf_counter()
            data_preprocess = self.preprocess(data)
            timings["preprocess"] = time.perf_counter() - mark
            if not self._is_explain():
                mark = time.perf_counter()
                output = self.inference(data_preprocess)
                self._sync_device()
                timings["inference"] = time.perf_counter() - mark
                mark = time.perf_counter()
                output = self.postprocess(output)
                timings["postprocess"] = time.perf_counter() - mark
            else:
                mark = time.perf_counter()
                output = self.explain_handle(data_preprocess, data)
                timings["explain"] = time.perf_counter() - mark

        elapsed_ms = round((time.perf_counter() - start) * 1000, 2)
        context.metrics.add_time("HandlerTime", elapsed_ms, None, "ms")
        return output

    def _sync_device(self) -> None:
        # CUDA kernels are asynchronous; without this the inference time lands in postprocess.
        if self.device is not None and self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    # -- describe / explain ---------------------------------------------------------------------

    def explain_handle(self, data_preprocess: Any, raw_data: list) -> Any:
        """Explanations via ``get_insights``; inputs and ``target`` come from the first row."""
        inputs = None
        target = 0
        row = raw_data[0] if raw_data else None
        if isinstance(row, dict):
            inputs = row.get("data") or row.get("body")
            target = row.get("target") or 0
        return self.get_insights(data_preprocess, inputs, target)

    def get_insights(self, tensor_data: Any, raw_input: Any, target: Any = 0) -> Any:
        """Attributions for ``/explanations``; a handler that explains overrides this."""
        raise PredictionException(f"{type(self).__name__} does not support explanations", 501)

    def _is_explain(self) -> bool:
        if self.context and _is_true(self.context.get_request_header(0, "explain")):
            self.explain = True
            return True
        return False

    def _is_describe(self) -> bool:
        return bool(self.context and _is_true(self.context.get_request_header(0, "describe")))

    def describe_handle(self) -> Any:
        """Body of a describe request (customised by subclasses; None by default)."""
        return None

    def get_device(self) -> torch.device | None:
        return self.device


def _placed_for_inference(model: Any, device: torch.device | None) -> Any:
    """``model.to(device)`` and ``model.eval()`` where the model has them (an ``nn.Module``)."""
    if device is not None and callable(getattr(model, "to", None)):
        moved = model.to(device)
        model = moved if moved is not None else model
    if callable(getattr(model, "eval", None)):
        model.eval()
    return model


def _is_true(value: Any) -> bool:
    if isinstance(value, (bytes, bytearray)):
        value = value.decode("utf-8", "replace")
    return str(value).lower() == "true" if value is not None else False
