"""Models the tensor fast path can run directly: ONNX, TorchScript, ``torch.export`` and eager.

An adapter knows the model's input and output metadata (read from the ONNX graph, the TorchScript
signature or the exported program, or declared under ``metadata:`` in model-config.yaml), checks
request tensors against it, and runs a batch: requests whose inputs agree in everything but the
batch dimension are concatenated along dimension 0, run once, and the outputs split back.
"""

from __future__ import annotations

import inspect
import logging
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from handlers.exceptions import InvalidTensorInput, TensorError
from serve.wire.tensors import NUMPY_DTYPES, datatype_of

logger = logging.getLogger(__name__)

_ORT_DATATYPES = {
    "tensor(bool)": "BOOL",
    "tensor(uint8)": "UINT8",
    "tensor(uint16)": "UINT16",
    "tensor(uint32)": "UINT32",
    "tensor(uint64)": "UINT64",
    "tensor(int8)": "INT8",
    "tensor(int16)": "INT16",
    "tensor(int32)": "INT32",
    "tensor(int64)": "INT64",
    "tensor(float16)": "FP16",
    "tensor(float)": "FP32",
    "tensor(double)": "FP64",
    "tensor(bfloat16)": "BF16",
    "tensor(string)": "BYTES",
}
_INTEGERS = ("INT8", "INT16", "INT32", "INT64", "UINT8", "UINT16", "UINT32", "UINT64")
_TORCH_DATATYPES = {
    "torch.bool": "BOOL",
    "torch.uint8": "UINT8",
    "torch.uint16": "UINT16",
    "torch.uint32": "UINT32",
    "torch.uint64": "UINT64",
    "torch.int8": "INT8",
    "torch.int16": "INT16",
    "torch.int32": "INT32",
    "torch.int64": "INT64",
    "torch.float16": "FP16",
    "torch.float32": "FP32",
    "torch.float64": "FP64",
    "torch.bfloat16": "BF16",
}


@dataclass(slots=True)
class TensorSpec:
    """One input or output: ``datatype`` "" and ``shape`` [] when the model does not say."""

    name: str
    datatype: str = ""
    shape: list[int] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {"name": self.name, "datatype": self.datatype, "shape": list(self.shape)}


Feeds = dict[str, tuple[np.ndarray, str]]  # input name -> (array, OIP datatype)
Outputs = list[tuple[str, np.ndarray, str]]  # (name, array, OIP datatype)


def declared_specs(config: dict[str, Any], key: str) -> list[TensorSpec] | None:
    """``metadata: {inputs: [...], outputs: [...]}`` from model-config.yaml, if well formed."""
    metadata = config.get("metadata") if isinstance(config, dict) else None
    entries = metadata.get(key) if isinstance(metadata, dict) else None
    if entries is None:
        return None
    specs = []
    try:
        for entry in entries:
            datatype = str(entry.get("datatype", "")).upper()
            if datatype and datatype not in NUMPY_DTYPES:
                raise ValueError(f"unknown datatype {datatype}")
            shape = [int(d) for d in entry.get("shape", [])]
            specs.append(TensorSpec(str(entry["name"]), datatype, shape))
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        logger.warning("Ignoring malformed metadata.%s in model-config.yaml: %s", key, exc)
        return None
    return specs


def declared_platform(config: dict[str, Any]) -> str | None:
    metadata = config.get("metadata") if isinstance(config, dict) else None
    platform = metadata.get("platform") if isinstance(metadata, dict) else None
    return str(platform) if platform else None


class ModelAdapter:
    """Metadata plus ``run(feeds) -> outputs`` for one model."""

    platform = ""
    batchable = True  # may requests be concatenated along dimension 0?
    # Triton's max_batch_size (config.pbtxt): requests with more rows are refused; 0: no limit.
    max_batch_size = 0

    def __init__(self, inputs: list[TensorSpec], outputs: list[TensorSpec]) -> None:
        self.inputs = inputs
        self.outputs = outputs
        # Input dtypes learned from the model itself where nothing declared them (TorchAdapter):
        # JSON values are cast to them and metadata states them; typed requests are not held
        # to them (a module may take several dtypes).
        self.learned: dict[str, str] = {}
        # Triton's reshape: name -> the shape the model takes (inputs) or gives (outputs),
        # without the batch dimension when the model batches.
        self.reshapes: dict[str, list[int]] = {}

    def metadata(self) -> dict[str, Any]:
        inputs = [
            {**s.as_json(), "datatype": s.datatype or self.learned.get(s.name, "")}
            for s in self.inputs
        ]
        return {
            "platform": self.platform,
            "inputs": inputs,
            "outputs": [s.as_json() for s in self.outputs],
            "tensor_path": True,
        }

    def run(self, feeds: Feeds) -> Outputs:
        raise NotImplementedError

    def run_declared(self, feeds: Feeds) -> Outputs:
        """`run`, with the declared reshapes applied to inputs before and outputs after."""
        if not self.reshapes:
            return self.run(feeds)
        feeds = {
            name: (self._reshaped(name, array), datatype)
            for name, (array, datatype) in feeds.items()
        }
        outputs = self.run(feeds)
        declared = {s.name: s for s in self.outputs}
        reshaped = []
        for name, array, datatype in outputs:
            spec = declared.get(name)
            if name in self.reshapes and spec is not None and spec.shape:
                dims = spec.shape[1:] if self.max_batch_size > 0 else spec.shape
                lead = [array.shape[0]] if self.max_batch_size > 0 and array.ndim else []
                array = array.reshape(lead + [d if d >= 0 else -1 for d in dims])
            reshaped.append((name, array, datatype))
        return reshaped

    def _reshaped(self, name: str, array: np.ndarray) -> np.ndarray:
        shape = self.reshapes.get(name)
        if shape is None:
            return array
        lead = [array.shape[0]] if self.max_batch_size > 0 and array.ndim else []
        try:
            return array.reshape(lead + shape)
        except ValueError:
            raise InvalidTensorInput(
                f"input '{name}' of shape {list(array.shape)} cannot be reshaped to {shape}"
            ) from None

    def inputs_batch_first(self) -> bool:
        """Whether every input's first dimension is dynamic (-1): a graph whose requests may be
        concatenated along it."""
        return all(bool(s.shape) and s.shape[0] == -1 for s in self.inputs)

    def apply_declared(self, config: dict[str, Any]) -> None:
        """Declared metadata wins over what was read from the model (names map by position)."""
        inputs = declared_specs(config, "inputs")
        outputs = declared_specs(config, "outputs")
        if inputs is not None:
            self.inputs = inputs
        if outputs is not None:
            self.outputs = outputs
        self.platform = declared_platform(config) or self.platform
        metadata = config.get("metadata") if isinstance(config, dict) else None
        if isinstance(metadata, dict):
            self.max_batch_size = _non_negative(metadata.get("maxBatchSize"))
            for key in ("inputs", "outputs"):
                for entry in metadata.get(key) or []:
                    if isinstance(entry, dict) and isinstance(entry.get("reshape"), list):
                        self.reshapes[str(entry["name"])] = [int(d) for d in entry["reshape"]]


def _non_negative(value: Any) -> int:
    try:
        return max(0, int(value or 0))
    except (TypeError, ValueError):
        return 0


# ----- ONNX -----------------------------------------------------------------------------------


def _ort_spec(arg: Any) -> TensorSpec:
    shape = [d if isinstance(d, int) and d >= 0 else -1 for d in (arg.shape or [])]
    return TensorSpec(arg.name, _ORT_DATATYPES.get(arg.type, ""), shape)


class OnnxAdapter(ModelAdapter):
    platform = "onnxruntime_onnx"

    def __init__(self, session: Any) -> None:
        self.session = session
        super().__init__(
            [_ort_spec(a) for a in session.get_inputs()],
            [_ort_spec(a) for a in session.get_outputs()],
        )
        self._graph_inputs = [a.name for a in session.get_inputs()]
        self._graph_outputs = [a.name for a in session.get_outputs()]
        self.batchable = self.inputs_batch_first()

    def apply_declared(self, config: dict[str, Any]) -> None:
        super().apply_declared(config)
        self.batchable = self.inputs_batch_first()

    def run(self, feeds: Feeds) -> Outputs:
        # Declared names map to graph inputs by position, so a config may rename them.
        names = dict(zip((s.name for s in self.inputs), self._graph_inputs, strict=False))
        ort_feeds = {}
        for name, (array, datatype) in feeds.items():
            if datatype == "BYTES":
                array = _bytes_to_str(array, name)
            ort_feeds[names.get(name, name)] = array
        results = self.session.run(None, ort_feeds)
        out_names = [s.name for s in self.outputs] or self._graph_outputs
        outputs = []
        for i, result in enumerate(results):
            array = np.asarray(result)
            name = out_names[i] if i < len(out_names) else self._graph_outputs[i]
            if array.dtype == object:
                array = _str_to_bytes(array)
            outputs.append((name, array, datatype_of(array)))
        return outputs


def _bytes_to_str(array: np.ndarray, name: str) -> np.ndarray:
    out = np.empty(array.shape, dtype=object)
    try:
        out.reshape(-1)[:] = [
            v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in array.reshape(-1)
        ]
    except UnicodeDecodeError:
        raise InvalidTensorInput(f"input '{name}': ONNX string inputs must be UTF-8") from None
    return out


def _str_to_bytes(array: np.ndarray) -> np.ndarray:
    out = np.empty(array.shape, dtype=object)
    out.reshape(-1)[:] = [
        v.encode("utf-8") if isinstance(v, str) else bytes(v) for v in array.reshape(-1)
    ]
    return out


# ----- OpenVINO -------------------------------------------------------------------------------

_OV_DATATYPES = {
    "boolean": "BOOL",
    "u8": "UINT8",
    "u16": "UINT16",
    "u32": "UINT32",
    "u64": "UINT64",
    "i8": "INT8",
    "i16": "INT16",
    "i32": "INT32",
    "i64": "INT64",
    "f16": "FP16",
    "f32": "FP32",
    "f64": "FP64",
    "bf16": "BF16",
    "string": "BYTES",
}


def _ov_spec(port: Any) -> TensorSpec:
    shape = port.get_partial_shape()
    dims = [] if shape.rank.is_dynamic else [d.get_length() if d.is_static else -1 for d in shape]
    return TensorSpec(
        port.get_any_name(), _OV_DATATYPES.get(port.get_element_type().get_type_name(), ""), dims
    )


class OpenVinoAdapter(ModelAdapter):
    platform = "openvino"

    def __init__(self, model: Any) -> None:
        self.model = model
        compiled = model.compiled
        super().__init__(
            [_ov_spec(p) for p in compiled.inputs], [_ov_spec(p) for p in compiled.outputs]
        )
        self._graph_inputs = [s.name for s in self.inputs]
        self._graph_outputs = [s.name for s in self.outputs]
        self.batchable = self.inputs_batch_first()

    def apply_declared(self, config: dict[str, Any]) -> None:
        super().apply_declared(config)
        self.batchable = self.inputs_batch_first()

    def run(self, feeds: Feeds) -> Outputs:
        names = dict(zip((s.name for s in self.inputs), self._graph_inputs, strict=False))
        ov_feeds = {names.get(name, name): array for name, (array, _) in feeds.items()}
        results = self.model.infer(ov_feeds)
        out_names = [s.name for s in self.outputs] or self._graph_outputs
        return [
            (out_names[i] if i < len(out_names) else f"output{i}", array, datatype_of(array))
            for i, array in enumerate(results)
        ]


# ----- torch ----------------------------------------------------------------------------------


class TorchAdapter(ModelAdapter):
    """TorchScript, exported (``.pt2``) or eager modules, called with positional tensors."""

    def __init__(self, module: Any, device: Any, platform: str) -> None:
        self.module = module
        self.device = device
        self.platform = platform
        inputs, outputs = _torch_signature(module)
        super().__init__(inputs, outputs)

    def run(self, feeds: Feeds) -> Outputs:
        """Run the module. A TorchScript or eager module does not say its input dtypes (unless
        model-config.yaml's ``metadata`` declares them), so JSON numbers are guessed (integers
        as INT64). When the module refuses integer inputs nobody declared, they are tried once
        as FP32 (torch's default); if that works, FP32 is learned for them (``learned``): later
        JSON values are cast to it and metadata states it."""
        try:
            return self._call(feeds)
        except RuntimeError:
            guessed = [
                s.name for s in self.inputs if not s.datatype and feeds[s.name][1] in _INTEGERS
            ]
            if not guessed:
                raise
            retry = dict(feeds)
            for name in guessed:
                retry[name] = (feeds[name][0].astype(np.float32), "FP32")
            outputs = self._call(retry)
        for name in guessed:
            if name not in self.learned:
                logger.info("Input %s taken as FP32: the model refused integers", name)
            self.learned[name] = "FP32"
        return outputs

    def _call(self, feeds: Feeds) -> Outputs:
        import torch

        args = []
        for spec in self.inputs:
            array, datatype = feeds[spec.name]
            args.append(_to_torch(array, datatype, spec.name).to(self.device))
        with torch.inference_mode():
            result = self.module(*args)
        return self._outputs(result)

    def _outputs(self, result: Any) -> Outputs:
        import torch

        if isinstance(result, torch.Tensor):
            items: list[tuple[str | None, Any]] = [(None, result)]
        elif isinstance(result, dict):
            items = [(str(k), v) for k, v in result.items()]
        elif isinstance(result, (list, tuple)):
            items = [(None, v) for v in result]
        else:
            raise TensorError(f"the model returned {type(result).__name__}, not tensors")
        outputs = []
        for i, (key, value) in enumerate(items):
            if not isinstance(value, torch.Tensor):
                raise TensorError(f"model output {i} is a {type(value).__name__}, not a tensor")
            if key is None:
                key = self.outputs[i].name if i < len(self.outputs) else f"output{i}"
            array, datatype = _from_torch(value)
            outputs.append((key, array, datatype))
        return outputs


def _to_torch(array: np.ndarray, datatype: str, name: str) -> Any:
    import torch

    if datatype == "BYTES":
        raise InvalidTensorInput(f"input '{name}': BYTES tensors cannot be passed to a torch model")
    if not array.flags.writeable:  # a view of the request bytes: torch wants its own memory
        array = array.copy()
    if datatype == "BF16":
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(np.ascontiguousarray(array))


def _from_torch(tensor: Any) -> tuple[np.ndarray, str]:
    import torch

    tensor = tensor.detach().cpu()
    if tensor.dtype == torch.bfloat16:
        return tensor.contiguous().view(torch.int16).numpy().view("<u2"), "BF16"
    array = tensor.numpy()
    return array, datatype_of(array)


def _torch_signature(module: Any) -> tuple[list[TensorSpec], list[TensorSpec]]:
    import torch

    target = getattr(module, "_orig_mod", module)  # torch.compile wraps the module
    forward = getattr(target, "forward", None)
    if isinstance(target, torch.jit.ScriptModule) and isinstance(forward, torch.ScriptMethod):
        args = forward.schema.arguments[1:]  # [0] is self
        return [TensorSpec(a.name) for a in args], []
    if isinstance(target, torch.fx.GraphModule):
        inputs, outputs = [], []
        for node in target.graph.nodes:
            if node.op == "placeholder":
                inputs.append(_fake_spec(node.name, node.meta.get("val")))
            elif node.op == "output":
                vals = node.meta.get("val")
                vals = vals if isinstance(vals, (list, tuple)) else [vals]
                outputs = [_fake_spec(f"output{i}", v) for i, v in enumerate(vals)]
        if any(not s.datatype for s in outputs):
            outputs = []
        return inputs, outputs
    params = inspect.signature(target.forward).parameters.values()
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return [TensorSpec(p.name) for p in params if p.kind in positional], []


def _fake_spec(name: str, value: Any) -> TensorSpec:
    dtype = getattr(value, "dtype", None)
    shape = getattr(value, "shape", None)
    if dtype is None or shape is None:
        return TensorSpec(name)
    dims = [d if isinstance(d, int) else -1 for d in shape]
    return TensorSpec(name, _TORCH_DATATYPES.get(str(dtype), ""), dims)


# ----- choosing an adapter --------------------------------------------------------------------


def adapter_for(service: Any) -> ModelAdapter | None:
    """The fast-path adapter for a service, or None when its handler must see every request.

    The rule: the handler is ``BaseHandler`` itself or a subclass that overrides none of
    ``handle``, ``preprocess``, ``inference`` and ``postprocess`` (so it adds nothing to what the
    fast path does), and its model is an ONNX session or a torch module.
    """
    handler = getattr(service, "handler", None)
    if handler is None:
        return None
    from handlers.base_handler import BaseHandler
    from handlers.runtimes import OnnxModel, OpenVinoModel

    if not isinstance(handler, BaseHandler):
        return None
    cls = type(handler)
    if any(getattr(cls, m) is not getattr(BaseHandler, m) for m in _PHASES):
        return None
    model = handler.model
    config = getattr(handler, "model_yaml_config", None) or {}
    adapter: ModelAdapter
    if type(model).__name__ == "SavedModel" and type(model).__module__ == "handlers.savedmodel":
        from handlers.savedmodel import SavedModelAdapter

        adapter = SavedModelAdapter(model)
    elif isinstance(model, OnnxModel):
        adapter = OnnxAdapter(model.session)
    elif isinstance(model, OpenVinoModel):
        adapter = OpenVinoAdapter(model)
    else:
        import torch

        target = getattr(model, "_orig_mod", model)
        if isinstance(target, torch.jit.ScriptModule):
            platform = "pytorch_libtorch"
        elif isinstance(target, torch.fx.GraphModule):
            platform = "pytorch_export"
        elif isinstance(target, torch.nn.Module):
            platform = "pytorch_eager"
        else:
            return None
        adapter = TorchAdapter(model, handler.device, platform)
    adapter.apply_declared(config)
    return adapter


_PHASES = ("handle", "preprocess", "inference", "postprocess")


# ----- checking and running requests ---------------------------------------------------------


def check_feeds(adapter: ModelAdapter, feeds: Feeds, model: str, *, strict: bool) -> None:
    """Raise 400 for unknown or missing inputs, a wrong datatype (``strict``) or a wrong shape."""
    specs = {s.name: s for s in adapter.inputs}
    limit = adapter.max_batch_size
    if limit > 0:
        rows = max((array.shape[0] for array, _ in feeds.values() if array.ndim), default=0)
        if rows > limit:  # Triton's words for it
            raise InvalidTensorInput(
                f"inference request batch-size must be <= {limit} for '{model}'"
            )
    for name in feeds:
        if name not in specs:
            raise InvalidTensorInput(f"unexpected inference input '{name}' for model '{model}'")
    missing = [s.name for s in adapter.inputs if s.name not in feeds]
    if missing:
        raise InvalidTensorInput(
            f"expected {len(specs)} inputs but got {len(feeds)} inputs for model '{model}'; "
            f"missing: {', '.join(missing)}"
        )
    for name, (array, datatype) in feeds.items():
        spec = specs[name]
        if strict and spec.datatype and datatype != spec.datatype:
            raise InvalidTensorInput(
                f"unexpected datatype {datatype} for inference input '{name}', "
                f"expecting {spec.datatype}"
            )
        if spec.shape and (
            array.ndim != len(spec.shape)
            or any(w != -1 and w != g for w, g in zip(spec.shape, array.shape, strict=True))
        ):
            raise InvalidTensorInput(
                f"unexpected shape for input '{name}' for model '{model}'. "
                f"Expected {list(spec.shape)}, got {list(array.shape)}"
            )


def values_to_feeds(
    adapter: ModelAdapter, rows: Sequence[dict[str, Any]], *, columnar: bool, model: str
) -> Feeds:
    """KServe v1 values (per-instance rows, or one columnar row) as typed arrays.

    Instances are stacked into a new batch dimension; columnar values already have one. Values
    are cast to the model's declared datatype; where the model does not say, floats become FP32
    (torch's default) and integers INT64.
    """
    names = list(rows[0])
    rename = {}
    if names == ["data"]:
        if len(adapter.inputs) != 1:
            raise InvalidTensorInput(
                f"model '{model}' has {len(adapter.inputs)} inputs; name them in each instance "
                f"({', '.join(s.name for s in adapter.inputs)})"
            )
        rename = {"data": adapter.inputs[0].name}
    specs = {s.name: s for s in adapter.inputs}
    feeds: Feeds = {}
    for key in names:
        name = rename.get(key, key)
        spec = specs.get(name)
        if spec is None:
            raise InvalidTensorInput(f"unexpected inference input '{key}' for model '{model}'")
        values = rows[0][key] if columnar else [row[key] for row in rows]
        learned = adapter.learned.get(name)
        if learned and not spec.datatype:
            spec = TensorSpec(spec.name, learned, spec.shape)
        feeds[name] = _typed(values, spec, name)
    return feeds


def _typed(values: Any, spec: TensorSpec, name: str) -> tuple[np.ndarray, str]:
    try:
        array = np.asarray(values)
        if array.dtype.kind in "SU":  # numpy's fixed-width strings drop trailing NUL bytes
            array = np.array(values, dtype=object)
    except ValueError:
        raise InvalidTensorInput(
            f"input '{name}': the values are not a regular (rectangular) array"
        ) from None
    if array.dtype == object and _all_text(array):
        out = np.empty(array.shape, dtype=object)
        out.reshape(-1)[:] = [
            v.encode("utf-8") if isinstance(v, str) else bytes(v) for v in array.reshape(-1)
        ]
        array = out
    elif array.dtype == object:
        raise InvalidTensorInput(
            f"input '{name}': the values are not a regular (rectangular) array"
        )
    datatype = spec.datatype
    if not datatype:
        kind = array.dtype.kind
        datatype = {"f": "FP32", "i": "INT64", "u": "INT64", "b": "BOOL"}.get(kind, "BYTES")
    if datatype == "BYTES":
        if array.dtype != object:
            raise InvalidTensorInput(f"input '{name}' takes strings or {{\"b64\": ...}} values")
        return array, datatype
    if array.dtype == object:
        raise InvalidTensorInput(f"input '{name}' takes {datatype} numbers, not strings")
    try:
        if datatype == "BF16":
            from serve.wire.tensors import float32_to_bf16

            return float32_to_bf16(array.astype(np.float32)), datatype
        return array.astype(NUMPY_DTYPES[datatype]), datatype
    except (ValueError, TypeError, OverflowError) as exc:
        raise InvalidTensorInput(
            f"input '{name}': cannot convert the values to {datatype}: {exc}"
        ) from None


def _all_text(array: np.ndarray) -> bool:
    return all(isinstance(v, (str, bytes)) for v in array.reshape(-1))


@dataclass(slots=True)
class Job:
    """One request's inputs on the fast path."""

    key: int
    feeds: Feeds

    @property
    def rows(self) -> int | None:
        """The shared size of dimension 0 of every input, or None if they disagree."""
        sizes = {array.shape[0] if array.ndim else None for array, _ in self.feeds.values()}
        return sizes.pop() if len(sizes) == 1 else None

    def signature(self) -> tuple[Any, ...]:
        return tuple(sorted((n, a.dtype.str, dt, a.shape[1:]) for n, (a, dt) in self.feeds.items()))


def run_jobs(adapter: ModelAdapter, jobs: list[Job]) -> dict[int, Outputs | Exception]:
    """Run every job, concatenating compatible ones; each job gets its outputs or its error."""
    groups: dict[Any, list[Job]] = defaultdict(list)
    for job in jobs:
        batchable = adapter.batchable and job.rows is not None
        groups[job.signature() if batchable else ("alone", job.key)].append(job)
    results: dict[int, Outputs | Exception] = {}
    for group in groups.values():
        if len(group) > 1 and _run_together(adapter, group, results):
            continue
        for job in group:
            try:
                results[job.key] = adapter.run_declared(job.feeds)
            except Exception as exc:  # reported per request by the caller
                results[job.key] = exc
    return results


def _run_together(
    adapter: ModelAdapter, group: list[Job], results: dict[int, Outputs | Exception]
) -> bool:
    sizes = [job.rows or 0 for job in group]
    total = sum(sizes)
    feeds: Feeds = {}
    for name, (_, datatype) in group[0].feeds.items():
        feeds[name] = (np.concatenate([job.feeds[name][0] for job in group]), datatype)
    try:
        outputs = adapter.run_declared(feeds)
    except Exception:
        # One request may be at fault: run them one by one so only that one fails.
        logger.debug("A concatenated batch failed; running its requests one by one", exc_info=True)
        return False
    if not all(array.ndim and array.shape[0] == total for _, array, _ in outputs):
        return False  # outputs without a batch dimension cannot be split between requests
    bounds = np.cumsum(sizes)[:-1]
    per_output = [(n, np.split(a, bounds), dt) for n, a, dt in outputs]
    for i, job in enumerate(group):
        results[job.key] = [(n, parts[i], dt) for n, parts, dt in per_output]
    return True
