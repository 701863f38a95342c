"""Model loaders by file type, and the device/thread choices they depend on.

TorchScript ``.pt``, eager ``model.py`` + state dict, ONNX via onnxruntime, and ``torch.export``
``.pt2``. Nothing here ever unpickles arbitrary objects: state dicts load with
``weights_only=True``.
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from handlers.exceptions import HandlerLoadError
from handlers.modules import ensure_on_sys_path, import_file, list_classes_from_module

logger = logging.getLogger(__name__)

# onnxruntime element types -> numpy dtypes, to cast inputs the way the graph declares them.
_ORT_DTYPES = {
    "tensor(float)": np.float32,
    "tensor(float16)": np.float16,
    "tensor(double)": np.float64,
    "tensor(int64)": np.int64,
    "tensor(int32)": np.int32,
    "tensor(int16)": np.int16,
    "tensor(int8)": np.int8,
    "tensor(uint8)": np.uint8,
    "tensor(bool)": np.bool_,
}


def select_device(gpu_id: int | None) -> torch.device:
    """``cuda:<gpu_id>`` when CUDA is usable and a GPU was assigned, else CPU."""
    if gpu_id is not None and torch.cuda.is_available():
        return torch.device(f"cuda:{int(gpu_id)}")
    return torch.device("cpu")


def set_num_threads(num_threads: int | None) -> None:
    """Cap torch's intra-op threads (the worker's CPU share); None keeps torch's default."""
    if num_threads:
        torch.set_num_threads(int(num_threads))


def load_torchscript(path: str, device: torch.device | None) -> torch.nn.Module:
    """``torch.jit.load`` onto ``device`` (None: where it was saved), in eval mode."""
    with warnings.catch_warnings():
        # TorchScript is deprecated for authors, but serving existing archives is the point here.
        warnings.filterwarnings(
            "ignore", message=r".*torch\.jit.*deprecated", category=FutureWarning
        )
        model = torch.jit.load(path, map_location=device)
    model.eval()
    return model


def load_eager(
    model_dir: str, model_file: str, weights_path: str | None, device: torch.device | None
) -> torch.nn.Module:
    """Instantiate the one ``nn.Module`` subclass defined in ``model_file``, load its state dict.

    The class is built with no arguments (TorchServe's rule). Without ``weights_path`` the
    model keeps its initial weights, as in TorchServe.
    """
    model_def_path = os.path.join(model_dir, model_file)
    if not os.path.isfile(model_def_path):
        raise HandlerLoadError(f"model file {model_file!r} is missing from the model directory")
    ensure_on_sys_path(model_dir)
    module = import_file(model_def_path)
    classes = list_classes_from_module(module, torch.nn.Module)
    if len(classes) != 1:
        names = [c.__name__ for c in classes]
        raise HandlerLoadError(
            f"{model_file} must define exactly one torch.nn.Module subclass, found {names}"
        )
    model = classes[0]()
    if weights_path:
        try:
            state_dict = torch.load(weights_path, map_location=device, weights_only=True)
        except Exception as exc:
            raise HandlerLoadError(
                f"{os.path.basename(weights_path)} could not be read as a state dict with "
                f"weights_only=True (save model.state_dict(), not the pickled model): {exc}"
            ) from exc
        if not isinstance(state_dict, Mapping):
            raise HandlerLoadError(
                f"{os.path.basename(weights_path)} holds a {type(state_dict).__name__}, "
                "not a state dict"
            )
        model.load_state_dict(state_dict)
    model.to(device)
    model.eval()
    return model


def load_exported(path: str, device: torch.device | None) -> torch.nn.Module:
    """A ``torch.export`` program (``torch.export.save``) as a callable module on ``device``
    (None: where it was saved)."""
    module = torch.export.load(path).module()
    # Exported modules refuse .eval(); they were captured in whatever mode export saw.
    return module.to(device)


class OnnxModel:
    """An onnxruntime session called like a module: tensors in, tensors out.

    Inputs are converted to numpy (cast to the dtype the graph declares) and bound to the graph
    inputs in order; outputs come back as CPU tensors, one tensor for a single-output graph,
    else a tuple. Other attributes (``run``, ``get_inputs``...) reach the session itself, so
    TorchServe handlers that call ``self.model.run(...)`` keep working.
    """

    def __init__(self, session: Any) -> None:
        self.session = session
        self._inputs = session.get_inputs()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if len(args) > len(self._inputs):
            raise ValueError(f"ONNX model takes {len(self._inputs)} inputs, got {len(args)}")
        feeds = {}
        for meta, value in zip(self._inputs, args, strict=False):
            feeds[meta.name] = self._to_numpy(value, meta.type)
        by_name = {meta.name: meta for meta in self._inputs}
        for name, value in kwargs.items():
            if name not in by_name:
                raise ValueError(f"ONNX model has no input named {name!r}")
            feeds[name] = self._to_numpy(value, by_name[name].type)
        outputs = [torch.from_numpy(np.asarray(out)) for out in self.session.run(None, feeds)]
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    @staticmethod
    def _to_numpy(value: Any, ort_type: str) -> np.ndarray:
        if isinstance(value, torch.Tensor):
            value = value.detach().cpu().numpy()
        array = np.ascontiguousarray(value)
        wanted = _ORT_DTYPES.get(ort_type)
        if wanted is not None and array.dtype != wanted:
            array = array.astype(wanted)
        return array

    def eval(self) -> OnnxModel:
        return self

    def to(self, *args: Any, **kwargs: Any) -> OnnxModel:
        # The execution provider fixed the device when the session was created.
        return self

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["session"], name)


def load_onnx(path: str, gpu_id: int | None, num_threads: int | None) -> OnnxModel:
    """An onnxruntime session: CUDA provider when a GPU is assigned and usable, else CPU."""
    import onnxruntime as ort

    available = ort.get_available_providers()
    providers: list[Any] = ["CPUExecutionProvider"]
    if gpu_id is not None and "CUDAExecutionProvider" in available:
        providers.insert(0, ("CUDAExecutionProvider", {"device_id": int(gpu_id)}))
    options = ort.SessionOptions()
    if num_threads:
        # TorchServe uses every logical CPU here; a worker's share avoids oversubscription.
        options.intra_op_num_threads = int(num_threads)
    session = ort.InferenceSession(path, sess_options=options, providers=providers)
    return OnnxModel(session)


class OpenVinoModel:
    """An OpenVINO compiled model (IR ``.xml`` + ``.bin``, or ONNX read by OpenVINO) called like a
    module: tensors in (by position or input name), tensors out (one, or a tuple)."""

    def __init__(self, compiled: Any) -> None:
        self.compiled = compiled
        self._names = [port.get_any_name() for port in compiled.inputs]

    def infer(self, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        """Numpy in by input name, numpy out in the model's output order."""
        results = self.compiled(dict(feeds))
        return [np.asarray(results[port]) for port in self.compiled.outputs]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        feeds = dict(zip(self._names, args, strict=False))
        feeds.update(kwargs)
        arrays = {
            name: value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else value
            for name, value in feeds.items()
        }
        outputs = [torch.from_numpy(out) for out in self.infer(arrays)]
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    def eval(self) -> OpenVinoModel:
        return self

    def to(self, *args: Any, **kwargs: Any) -> OpenVinoModel:
        return self  # the device was chosen when the model was compiled


def load_openvino(
    path: str,
    device: str | None = None,
    plugin_config: Mapping[str, Any] | None = None,
    num_threads: int | None = None,
    *,
    batch_size: int | str | None = None,
    shape: Any = None,
) -> OpenVinoModel:
    """Read and compile an IR (``model.xml`` beside ``model.bin``) once, on ``device`` (``CPU``
    by default; ``AUTO``, ``GPU``... as OpenVINO names them), with ``plugin_config`` passed
    through (``PERFORMANCE_HINT``, ``NUM_STREAMS``...). Needs ``lantern-serve[openvino]``.

    Before compiling, OVMS's ``batch_size`` (a number, or ``auto``: any) sets the batch dimension
    and ``shape`` (``auto``: every dimension dynamic; a list; or ``{input: shape}``) reshapes."""
    try:
        import openvino as ov
    except ImportError as exc:
        raise HandlerLoadError(
            f"{os.path.basename(path)} is an OpenVINO model: install lantern-serve[openvino] "
            "(pip install openvino)"
        ) from exc
    weights = os.path.splitext(path)[0] + ".bin"
    if path.endswith(".xml") and not os.path.isfile(weights):
        raise HandlerLoadError(
            f"{os.path.basename(path)}: its weights file {os.path.basename(weights)} is missing"
        )
    config = {str(k): v for k, v in (plugin_config or {}).items()}
    target = device or "CPU"
    if num_threads and target == "CPU" and "INFERENCE_NUM_THREADS" not in config:
        config["INFERENCE_NUM_THREADS"] = int(num_threads)  # the worker's share of the cores
    core = ov.Core()
    try:
        model = core.read_model(path)
        _reshape(ov, model, batch_size, shape)
        compiled = core.compile_model(model, target, config)
    except RuntimeError as exc:
        raise HandlerLoadError(
            f"{os.path.basename(path)}: OpenVINO could not load it: {exc}"
        ) from exc
    return OpenVinoModel(compiled)


def _reshape(ov: Any, model: Any, batch_size: int | str | None, shape: Any) -> None:
    if shape is not None:
        if shape == "auto":
            shape = {port.get_any_name(): "auto" for port in model.inputs}
        if isinstance(shape, Mapping):
            model.reshape(
                {
                    name: ov.PartialShape.dynamic(len(model.input(name).get_partial_shape()))
                    if dims == "auto"
                    else ov.PartialShape([int(d) for d in dims])
                    for name, dims in shape.items()
                }
            )
        else:
            model.reshape(ov.PartialShape([int(d) for d in shape]))
    if batch_size is not None:  # the first dimension of every input, as OVMS takes it
        batch = ov.Dimension() if batch_size == "auto" else ov.Dimension(int(batch_size))
        shapes = {}
        for port in model.inputs:
            dims = list(port.get_partial_shape())
            if dims:
                dims[0] = batch
                shapes[port.get_any_name()] = ov.PartialShape(dims)
        model.reshape(shapes)


def maybe_compile(model: Any, model_yaml_config: Mapping | None) -> Any:
    """Apply ``torch.compile`` when model-config.yaml asks for it (TorchServe's ``pt2`` key).

    ``pt2: {compile: {enable: true, backend: ..., mode: ...}}``, or the deprecated
    ``pt2: "<backend>"`` / ``pt2: {backend: ...}``. A failure logs and keeps the model as is.
    """
    pt2 = (model_yaml_config or {}).get("pt2")
    if not pt2 or not isinstance(model, torch.nn.Module):
        return model
    if isinstance(pt2, str):
        options: dict = {"backend": pt2}
    elif isinstance(pt2, Mapping) and "compile" in pt2:
        options = dict(pt2["compile"] or {})
        if not options.pop("enable", False):
            return model
    elif isinstance(pt2, Mapping) and "export" not in pt2:
        options = dict(pt2)
    else:
        return model
    try:
        compiled = torch.compile(model, **options)
    except Exception:
        logger.warning(
            "torch.compile(%s) failed; proceeding without compilation", options, exc_info=True
        )
        return model
    logger.info("Compiled model with %s", options)
    return compiled
