"""Build ``mimo.mar``: a two-input, two-output ONNX model (tokens + image -> features + classes).

The kind of multi-input, multi-output model users export to ONNX and call over the Open Inference
Protocol (KServe v2): a token sequence and an image go in, a feature vector and class
probabilities come out. The weights are random but seeded, so every build is the same.

    inputs:  tokens         INT64  [batch, sequence]      token ids in [0, 1000)
             image          FP32   [batch, 3, H, W]       any H, W
    outputs: features       FP32   [batch, 16]
             probabilities  FP32   [batch, 5]             each row sums to 1

The archive uses the built-in ``base_handler``, which loads the ``.onnx`` file into ONNX Runtime.

    python examples/multi_input_output/build.py [--model-store DIR]
"""

from __future__ import annotations

import sys
import tempfile
import warnings
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # for examples/_build.py
from _build import archive, main

MODEL_NAME = "mimo"
HERE = Path(__file__).resolve().parent
VOCAB_SIZE = 1000
FEATURES = 16
CLASSES = 5
SEED = 0


class TextImageModel(nn.Module):
    """Mean-pooled token embeddings and pooled conv features, fused into one feature vector."""

    def __init__(self) -> None:
        super().__init__()
        self.embedding = nn.Embedding(VOCAB_SIZE, 32)
        self.conv = nn.Sequential(
            nn.Conv2d(3, 16, kernel_size=3, stride=2, padding=1),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
        )
        self.fuse = nn.Linear(32 + 16, FEATURES)
        self.classify = nn.Linear(FEATURES, CLASSES)

    def forward(self, tokens: torch.Tensor, image: torch.Tensor) -> tuple[torch.Tensor, ...]:
        text = self.embedding(tokens).mean(dim=1)
        features = torch.tanh(self.fuse(torch.cat([text, self.conv(image)], dim=1)))
        return features, torch.softmax(self.classify(features), dim=1)


def make_model() -> TextImageModel:
    torch.manual_seed(SEED)
    return TextImageModel().eval()


def export(model: nn.Module, path: Path) -> Path:
    """Export to ONNX with dynamic batch, sequence length and image size."""
    example = (torch.zeros(1, 8, dtype=torch.int64), torch.zeros(1, 3, 32, 32))
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript-based exporter's deprecation notice
        torch.onnx.export(
            model,
            example,
            str(path),
            dynamo=False,
            input_names=["tokens", "image"],
            output_names=["features", "probabilities"],
            dynamic_axes={
                "tokens": {0: "batch", 1: "sequence"},
                "image": {0: "batch", 2: "height", 3: "width"},
                "features": {0: "batch"},
                "probabilities": {0: "batch"},
            },
        )
    return path


def build(model_store: Path) -> Path:
    """Write ``<model_store>/mimo.mar`` and return its path."""
    model_store.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        onnx_file = export(make_model(), Path(tmp) / "text_image.onnx")
        return archive(
            model_store,
            model_name=MODEL_NAME,
            handler="base_handler",
            serialized_file=str(onnx_file),
            config_file=str(HERE / "model-config.yaml"),
        )


if __name__ == "__main__":
    main(build, __doc__.splitlines()[0])
