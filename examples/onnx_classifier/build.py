"""Build ``efficientnet_lite0_onnx.mar``: the pretrained EfficientNet-Lite0, exported to ONNX.

The same classifier as ``examples/image_classifier``, exported with ``torch.onnx.export`` (the
TorchScript-based exporter, ``dynamo=False``) with a dynamic batch dimension, and served by the
built-in ``image_classifier`` handler through ONNX Runtime. Graph input ``image``
(float32, ``[batch, 3, 224, 224]``), output ``logits`` (float32, ``[batch, 1000]``).

    python examples/onnx_classifier/build.py [--model-store DIR]
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # for examples/_build.py
from _build import LABELS, archive, export_onnx, main, pretrained_efficientnet

MODEL_NAME = "efficientnet_lite0_onnx"


def build(model_store: Path) -> Path:
    """Write ``<model_store>/efficientnet_lite0_onnx.mar`` and return its path."""
    model_store.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        onnx_file = export_onnx(pretrained_efficientnet(), Path(tmp) / "efficientnet_lite0.onnx")
        return archive(
            model_store,
            model_name=MODEL_NAME,
            handler="image_classifier",
            serialized_file=str(onnx_file),
            extra_files=[str(LABELS)],
        )


if __name__ == "__main__":
    main(build, __doc__.splitlines()[0])
