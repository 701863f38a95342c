"""Archives move both ways: TorchServe's own torch-model-archiver 0.12 against ours.

Its archives are served in process, their handler run by an inline worker (the worker runtime in
this process).
"""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from archiver import build
from tests.support.inline_workers import InlineWorkers
from tests.support.inprocess import in_process, run, test_config
from tests.support.server import HANDLERS

# The real torch-model-archiver 0.12.0 (a dev dependency), called through its own entry point;
# the console script of that name is our alias.
_REAL_ARCHIVER = (
    "import sys; from model_archiver.model_packaging import generate_model_archive; "
    "sys.argv[0] = 'torch-model-archiver'; generate_model_archive()"
)


def real_archiver(*args: str, cwd: Path) -> None:
    subprocess.run(
        [sys.executable, "-c", _REAL_ARCHIVER, *args],
        cwd=cwd,
        check=True,
        capture_output=True,
        timeout=60,
    )


def manifest(path: Path) -> dict:
    if path.is_dir():
        return json.loads((path / "MAR-INF" / "MANIFEST.json").read_text())
    with zipfile.ZipFile(path) as zf:
        return json.loads(zf.read("MAR-INF/MANIFEST.json"))


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("inputs")
    (root / "echo_handler.py").write_text((HANDLERS / "echo_handler.py").read_text())
    (root / "weights.pt").write_bytes(b"\x00" * 64)
    (root / "labels.json").write_text('{"0": "zero"}')
    (root / "requirements.txt").write_text("numpy\n")
    (root / "model-config.yaml").write_text("batchSize: 4\nmaxBatchDelay: 10\nminWorkers: 1\n")
    return root


FLAGS = [
    "--model-name",
    "echo",
    "--version",
    "2.5",
    "--handler",
    "echo_handler.py",
    "--serialized-file",
    "weights.pt",
    "--extra-files",
    "labels.json",
    "--requirements-file",
    "requirements.txt",
    "--config-file",
    "model-config.yaml",
]


def test_manifests_are_the_same_field_for_field(
    inputs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    theirs_dir, ours_dir = tmp_path / "theirs", tmp_path / "ours"
    theirs_dir.mkdir()
    ours_dir.mkdir()
    real_archiver(*FLAGS, "--export-path", str(theirs_dir), cwd=inputs)
    monkeypatch.chdir(inputs)
    build(
        model_name="echo",
        version="2.5",
        handler="echo_handler.py",
        serialized_file="weights.pt",
        extra_files=["labels.json"],
        requirements_file="requirements.txt",
        config_file="model-config.yaml",
        export_path=str(ours_dir),
    )  # relative paths, as a user in that folder would pass
    theirs, ours = manifest(theirs_dir / "echo.mar"), manifest(ours_dir / "echo.mar")
    theirs.pop("createdOn")
    ours.pop("createdOn")
    assert ours == theirs
    with zipfile.ZipFile(theirs_dir / "echo.mar") as a, zipfile.ZipFile(ours_dir / "echo.mar") as b:
        assert sorted(a.namelist()) == sorted(b.namelist())


def test_archives_from_torchserve_archiver_serve_in_lantern(inputs: Path, tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    real_archiver(*FLAGS, "--export-path", str(store), cwd=inputs)
    real_archiver(
        *[f if f != "echo" else "echo_tgz" for f in FLAGS],
        "--archive-format",
        "tgz",
        "--export-path",
        str(store),
        cwd=inputs,
    )
    real_archiver(
        *[f if f != "echo" else "echo_dir" for f in FLAGS],
        "--archive-format",
        "no-archive",
        "--export-path",
        str(store),
        cwd=inputs,
    )
    names = sorted(p.name for p in store.iterdir())
    assert names == ["echo.mar", "echo_dir", "echo_tgz.tar.gz"]

    async def serve() -> None:
        config = test_config(tmp_path, store, load_models=names)
        async with in_process(config, InlineWorkers()) as lantern:
            for model in ("echo", "echo_tgz", "echo_dir"):
                resp = await lantern.inference.post(
                    f"/predictions/{model}/2.5",
                    content=b"hi",
                    headers={"content-type": "text/plain"},
                )
                assert resp.status_code == 200, resp.text
                assert resp.json()["echo"] == "hi"
                (described,) = (await lantern.management.get(f"/models/{model}")).json()
                assert described["batchSize"] == 4  # the archive's model-config.yaml applied

    run(serve)
