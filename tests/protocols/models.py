"""Protocol test support: tiny models built in code, their archives, and batch statistics."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np

from tests.support.server import build_archive

HANDLERS = Path(__file__).resolve().parent / "handlers"

# OIP datatype -> ONNX element type name, for the identity model.
ONNX_TYPES = {
    "BOOL": "BOOL",
    "UINT8": "UINT8",
    "INT32": "INT32",
    "INT64": "INT64",
    "FP16": "FLOAT16",
    "FP32": "FLOAT",
    "FP64": "DOUBLE",
    "BYTES": "STRING",
}


def multi_io_onnx(path: Path) -> Path:
    """tokens INT64 [B,8] + image FP32 [B,3,16,16] -> features FP32 [B,4], probabilities [B,3]."""
    import torch

    class MultiIO(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = torch.nn.Embedding(50, 4)
            self.pixels = torch.nn.Linear(3 * 16 * 16, 4)
            self.head = torch.nn.Linear(4, 3)

        def forward(self, tokens: torch.Tensor, image: torch.Tensor) -> Any:
            features = self.embed(tokens).mean(dim=1) + self.pixels(image.flatten(1))
            return features, torch.softmax(self.head(features), dim=-1)

    torch.manual_seed(0)
    model = MultiIO().eval()
    example = (torch.randint(0, 50, (2, 8)), torch.randn(2, 3, 16, 16))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            model,
            example,
            str(path),
            input_names=["tokens", "image"],
            output_names=["features", "probabilities"],
            dynamic_axes={
                n: {0: "batch"} for n in ("tokens", "image", "features", "probabilities")
            },
            dynamo=False,
        )
    return path


def identity_onnx(path: Path, datatypes: list[str]) -> Path:
    """One ``in_<DT>`` -> ``out_<DT>`` Identity per datatype, shape [batch, 2]."""
    from onnx import TensorProto, helper, save

    inputs, outputs, nodes = [], [], []
    for dt in datatypes:
        elem = getattr(TensorProto, ONNX_TYPES[dt])
        inputs.append(helper.make_tensor_value_info(f"in_{dt}", elem, ["batch", 2]))
        outputs.append(helper.make_tensor_value_info(f"out_{dt}", elem, ["batch", 2]))
        nodes.append(helper.make_node("Identity", [f"in_{dt}"], [f"out_{dt}"]))
    graph = helper.make_graph(nodes, "identity", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    save(model, str(path))
    return path


def scale_onnx(path: Path, factor: float) -> Path:
    """x FP32 [batch, 4] -> y = x * factor."""
    from onnx import TensorProto, helper, save

    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "factor"], ["y"])],
        "scale",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
        initializer=[helper.make_tensor("factor", TensorProto.FLOAT, [], [factor])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    save(model, str(path))
    return path


def exported_pt2(path: Path) -> Path:
    """torch.export: x FP32 [batch, 4], n INT64 [batch, 1] -> (x * n, x.sum(1) as FP64)."""
    import torch

    class Program(torch.nn.Module):
        def forward(self, x: torch.Tensor, n: torch.Tensor) -> Any:
            return x * n, x.sum(dim=1).double()

    batch = torch.export.Dim("batch", min=1, max=1024)
    example = (torch.ones(2, 4), torch.ones(2, 1, dtype=torch.int64))
    program = torch.export.export(
        Program(), example, dynamic_shapes={"x": {0: batch}, "n": {0: batch}}
    )
    torch.export.save(program, str(path))
    return path


def torchscript_pt(path: Path) -> Path:
    """TorchScript (traced): a FP32 [batch, 3] -> {"double": a * 2, "total": a.sum(1)}."""
    import torch

    class Script(torch.nn.Module):
        def forward(self, a: torch.Tensor) -> dict[str, torch.Tensor]:
            return {"double": a * 2, "total": a.sum(dim=1)}

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        scripted = torch.jit.script(Script())
        scripted.save(str(path))
    return path


def run_onnx(path: Path, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """The model run locally with onnxruntime: what the server must answer."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def base_archive(store: Path, name: str, model: Path, **kwargs: Any) -> Path:
    return build_archive(store, name, "base_handler", serialized_file=model, **kwargs)


def custom_archive(store: Path, name: str, **kwargs: Any) -> Path:
    return build_archive(store, name, HANDLERS / "tensor_handler.py", **kwargs)


def batch_stats(metrics_url: str, model: str) -> tuple[float, float]:
    """(batches, requests) the server sent to ``model``'s workers, from ``serve_batch_size``."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{metrics_url}/metrics", timeout=10).text
    batches = requests = 0.0
    for family in text_string_to_metric_families(text):
        if family.name != "serve_batch_size":
            continue
        for sample in family.samples:
            if sample.labels.get("model") != model:
                continue
            if sample.name.endswith("_count"):
                batches = sample.value
            elif sample.name.endswith("_sum"):
                requests = sample.value
    return batches, requests
