"""Build ``resnet18.mar``: torchvision's ResNet-18 in eager mode, as ``model.py`` + a state dict.

This is TorchServe's classic layout: the archive holds the model's source (``model.py``) and its
weights (``resnet18.pth``, a ``state_dict``), and the server rebuilds the model from both. No
pretrained ResNet weights ship in a pip package, so the weights are random but deterministic
(seeded): the archive is the same on every machine. Replace ``make_state_dict`` with your own
trained weights.

    python examples/resnet18_eager/build.py [--model-store DIR]
"""

from __future__ import annotations

import importlib.util
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # for examples/_build.py
from _build import LABELS, archive, main

MODEL_NAME = "resnet18"
SEED = 0
HERE = Path(__file__).resolve().parent


def make_state_dict() -> dict[str, torch.Tensor]:
    """The weights of a ResNet-18 initialised from a fixed seed."""
    # Loaded by path under its own name: a bare `import model` could pick up another model.py.
    spec = importlib.util.spec_from_file_location("resnet18_eager_model", HERE / "model.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    torch.manual_seed(SEED)
    return module.ImageClassifier().state_dict()


def build(model_store: Path) -> Path:
    """Write ``<model_store>/resnet18.mar`` and return its path."""
    model_store.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        weights = Path(tmp) / f"{MODEL_NAME}.pth"
        torch.save(make_state_dict(), weights)
        return archive(
            model_store,
            model_name=MODEL_NAME,
            handler="image_classifier",
            model_file=str(HERE / "model.py"),
            serialized_file=str(weights),
            extra_files=[str(LABELS)],
        )


if __name__ == "__main__":
    main(build, __doc__.splitlines()[0])
