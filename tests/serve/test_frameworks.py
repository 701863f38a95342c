"""What a model's workers will import, read off its archive (`serve.worker.frameworks`)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from serve.worker.frameworks import archive_frameworks

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("handler", "serialized", "expected"),
    [
        ("base_handler", "model.pt", {"torch"}),
        ("base_handler", "model.onnx", {"torch", "onnxruntime"}),
        ("image_classifier", "model.pt", {"torch", "torchvision"}),
        ("object_detector", "model.pt", {"torch", "torchvision"}),
        ("text_classifier", "model.pt", {"torch"}),
        ("image_classifier:handle", "model.pt", {"torch", "torchvision"}),
        ("no_such_handler", "model.pt", set()),  # unknown: learnt from the worker, as before
        ("", None, set()),
    ],
)
def test_built_in_handlers(handler: str, serialized: str | None, expected: set[str]) -> None:
    manifest = {"model": {"handler": handler, "serializedFile": serialized}}
    assert archive_frameworks(manifest, Path("/nonexistent")) == expected


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("import torch\n", {"torch"}),
        ("from ts.torch_handler.base_handler import BaseHandler\n", {"torch"}),
        ("from ts.torch_handler.vision_handler import VisionHandler\n", {"torch", "torchvision"}),
        ("import torchvision.transforms as T\nimport numpy\n", {"torchvision"}),
        ("from helpers import x\n", {"onnxruntime"}),  # a module beside it in the model folder
        # Imported only when called (or maybe not at all): not counted.
        ("def handle(data, ctx):\n    import torch\n    return data\n", set()),
        ("try:\n    import torch\nexcept ImportError:\n    torch = None\n", set()),
        ("import json\n", set()),
        ("this is not python(\n", set()),
    ],
)
def test_a_handler_file_in_the_model_folder(
    tmp_path: Path, source: str, expected: set[str]
) -> None:
    (tmp_path / "my_handler.py").write_text(source)
    (tmp_path / "helpers.py").write_text("import onnxruntime\n")
    manifest = {"model": {"handler": "my_handler.py", "serializedFile": "w.bin"}}
    assert archive_frameworks(manifest, tmp_path) == expected
    # The registration's own handler overrides the manifest's.
    assert archive_frameworks({"model": {}}, tmp_path, "my_handler:handle") == expected


def test_a_prediction_never_claims_what_the_handler_does_not_import() -> None:
    """The worker's own view: importing the handler brings at least what was predicted (so a
    spare that preloaded it carries nothing the worker would not have)."""
    code = (
        "import importlib, json, sys; importlib.import_module('handlers.image_classifier');"
        "print(json.dumps(sorted(m for m in ('torch', 'torchvision', 'onnxruntime')"
        " if m in sys.modules)))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    predicted = archive_frameworks({"model": {"handler": "image_classifier"}}, Path("/none"))
    assert predicted <= set(json.loads(out.stdout))
