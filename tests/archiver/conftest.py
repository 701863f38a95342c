"""Shared fixtures for the archiver tests: real model inputs written under tmp_path."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass
class ModelInputs:
    """Paths of one model's inputs, and the bytes each is expected to have in the archive."""

    root: Path
    handler: Path
    serialized: Path
    model_file: Path
    requirements: Path
    config: Path
    extra_dir: Path
    expected: dict[str, bytes]


@pytest.fixture
def inputs(tmp_path: Path) -> ModelInputs:
    """A handler, weights, model file, requirements, config and an extra folder with junk."""
    src = tmp_path / "src"
    src.mkdir()
    files = {
        "my_handler.py": b"def handle(data, context):\n    return data\n",
        "weights.pth": bytes(range(256)) * 64,
        "model.py": b"class Net:\n    pass\n",
        "requirements.txt": b"numpy\n",
        "model-config.yaml": b"minWorkers: 1\nbatchSize: 4\nhandler:\n  topk: 3\n",
    }
    for name, data in files.items():
        (src / name).write_bytes(data)
    extra = src / "extra"
    (extra / "sub" / "deeper").mkdir(parents=True)
    (extra / "index_to_name.json").write_bytes(b'{"0": "cat"}')
    (extra / "sub" / "vocab.txt").write_bytes(b"a\nb\n")
    (extra / "sub" / "deeper" / "x.bin").write_bytes(b"\x00\x01")
    # Everything below must be skipped, as torch-model-archiver does.
    for junk in ("__pycache__/m.cpython-311.pyc", "__MACOSX/._x", ".git/HEAD", "sub/.cache/y"):
        (extra / junk).parent.mkdir(parents=True, exist_ok=True)
        (extra / junk).write_bytes(b"junk")
    for junk in (".env", "stale.pyc", ".DS_Store", "old.mar", "sub/.hidden"):
        (extra / junk).write_bytes(b"junk")
    expected = dict(files)
    expected["index_to_name.json"] = b'{"0": "cat"}'
    expected["sub/vocab.txt"] = b"a\nb\n"
    expected["sub/deeper/x.bin"] = b"\x00\x01"
    return ModelInputs(
        root=src,
        handler=src / "my_handler.py",
        serialized=src / "weights.pth",
        model_file=src / "model.py",
        requirements=src / "requirements.txt",
        config=src / "model-config.yaml",
        extra_dir=extra,
        expected=expected,
    )
