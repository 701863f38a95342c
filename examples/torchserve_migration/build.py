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

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # for examples/_build.py
from _build import LABELS, main, pretrained_efficientnet, trace

HERE = Path(__file__).resolve().parent


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
        trace(pretrained_efficientnet(), work / "classifier.pt")
        shutil.copy(HERE / "ts_handler.py", work)
        shutil.copy(LABELS, work)
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


if __name__ == "__main__":
    main(build, __doc__.splitlines()[0])
