"""build(): output formats, manifest fidelity, extra-files rules, atomicity and progress."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import zipfile
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from archiver import ArchiveError, build, open_archive, read_manifest

if TYPE_CHECKING:
    from tests.archiver.conftest import ModelInputs

REPO_ROOT = Path(__file__).resolve().parents[2]
FORMATS = ["default", "zip-store", "tgz", "no-archive"]
OUTPUT_NAMES = {"default": "m.mar", "zip-store": "m.mar", "tgz": "m.tar.gz", "no-archive": "m"}


def tree(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` as {posix relative path: bytes}."""
    return {
        p.relative_to(folder).as_posix(): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def full_build(inputs: ModelInputs, export: Path, fmt: str, **overrides: Any) -> Path:
    kwargs: dict[str, Any] = dict(
        model_name="m",
        version="2.1",
        handler=str(inputs.handler),
        serialized_file=str(inputs.serialized),
        model_file=str(inputs.model_file),
        extra_files=[str(inputs.extra_dir)],
        requirements_file=str(inputs.requirements),
        config_file=str(inputs.config),
        export_path=str(export),
        archive_format=fmt,
    )
    kwargs.update(overrides)
    return build(**kwargs)


@pytest.mark.parametrize("fmt", FORMATS)
def test_round_trip(inputs: ModelInputs, tmp_path: Path, fmt: str) -> None:
    export = tmp_path / "export"
    export.mkdir()
    out = full_build(inputs, export, fmt)
    assert out == export / OUTPUT_NAMES[fmt]
    assert sorted(os.listdir(export)) == [OUTPUT_NAMES[fmt]]  # no temp files left behind

    archive = open_archive(out, tmp_path / "unpacked")
    manifest = read_manifest(out)
    assert archive.manifest == manifest
    assert (archive.model_name, archive.version, archive.handler) == ("m", "2.1", "my_handler.py")
    assert archive.model_config == {"minWorkers": 1, "batchSize": 4, "handler": {"topk": 3}}
    files = tree(archive.model_dir)
    assert json.loads(files.pop("MAR-INF/MANIFEST.json")) == manifest
    assert files == inputs.expected


def test_zip_compression_methods(inputs: ModelInputs, tmp_path: Path) -> None:
    deflated = full_build(inputs, tmp_path, "default")
    with zipfile.ZipFile(deflated) as zf:
        assert {i.compress_type for i in zf.infolist()} == {zipfile.ZIP_DEFLATED}
        assert set(zf.namelist()) == {*inputs.expected, "MAR-INF/MANIFEST.json"}
    stored = full_build(inputs, tmp_path, "zip-store", force=True)
    with zipfile.ZipFile(stored) as zf:
        assert {i.compress_type for i in zf.infolist()} == {zipfile.ZIP_STORED}


def test_tgz_has_one_top_folder(inputs: ModelInputs, tmp_path: Path) -> None:
    out = full_build(inputs, tmp_path, "tgz")
    with tarfile.open(out) as tf:
        names = tf.getnames()
    assert all(n.startswith("m/") for n in names)
    assert "m/MAR-INF/MANIFEST.json" in names
    assert open_archive(out, tmp_path / "x").model_dir == (tmp_path / "x" / "m").resolve()


def test_no_archive_is_a_folder_with_mar_inf(inputs: ModelInputs, tmp_path: Path) -> None:
    out = full_build(inputs, tmp_path, "no-archive")
    assert out.is_dir() and (out / "MAR-INF" / "MANIFEST.json").is_file()
    archive = open_archive(out, tmp_path / "unused")
    assert archive.model_dir == out.resolve()
    assert not (tmp_path / "unused").exists()  # a folder source is used in place


# --- manifest fidelity -------------------------------------------------------------------------


def _created_on(manifest: dict[str, Any]) -> str:
    created = manifest["createdOn"]
    datetime.strptime(created, "%d/%m/%Y %H:%M:%S")  # the exact TorchServe format
    return created


def test_manifest_matches_torch_model_archiver(inputs: ModelInputs, tmp_path: Path) -> None:
    # torch-model-archiver 0.12 output for the same inputs, written out by hand (§1.8).
    weights = inputs.root / "resnet18-f37072fd.pth"
    weights.write_bytes(b"w")
    out = build(
        model_name="resnet-18",
        version="1.0",
        handler="image_classifier",
        serialized_file=str(weights),
        model_file=str(inputs.model_file),
        requirements_file=str(inputs.requirements),
        config_file=str(inputs.config),
        export_path=str(tmp_path),
    )
    with zipfile.ZipFile(out) as zf:
        text = zf.read("MAR-INF/MANIFEST.json").decode()
        names = sorted(zf.namelist())
    manifest = json.loads(text)
    expected = {
        "createdOn": _created_on(manifest),
        "runtime": "python",
        "model": {
            "modelName": "resnet-18",
            "serializedFile": "resnet18-f37072fd.pth",
            "handler": "image_classifier",
            "modelFile": "model.py",
            "modelVersion": "1.0",
            "requirementsFile": "requirements.txt",
            "configFile": "model-config.yaml",
        },
        "archiverVersion": "0.12.0",
    }
    assert manifest == expected
    assert list(manifest) == list(expected)
    assert list(manifest["model"]) == list(expected["model"])
    assert text == json.dumps(expected, indent=2)  # same bytes, not just the same data
    # A built-in handler is resolved by the server: no handler file is packed.
    assert names == [
        "MAR-INF/MANIFEST.json",
        "model-config.yaml",
        "model.py",
        "requirements.txt",
        "resnet18-f37072fd.pth",
    ]


@pytest.mark.parametrize(
    ("handler", "manifest_handler", "packed"),
    [
        ("{root}/my_handler.py", "my_handler.py", "my_handler.py"),
        ("{root}/my_handler.py:handle", "my_handler.py:handle", "my_handler.py"),
        ("{root}/my_handler", "my_handler", "my_handler.py"),
        ("{root}/my_handler:handle", "my_handler:handle", "my_handler.py"),
        ("base_handler", "base_handler", None),
    ],
)
def test_handler_forms(
    inputs: ModelInputs, tmp_path: Path, handler: str, manifest_handler: str, packed: str | None
) -> None:
    out = build(
        model_name="h",
        version="1",
        handler=handler.format(root=inputs.root),
        export_path=str(tmp_path),
        runtime="python3",
    )
    with zipfile.ZipFile(out) as zf:
        manifest = json.loads(zf.read("MAR-INF/MANIFEST.json"))
        names = set(zf.namelist()) - {"MAR-INF/MANIFEST.json"}
    # Only what was given appears: every optional key is omitted.
    assert manifest == {
        "createdOn": _created_on(manifest),
        "runtime": "python3",
        "model": {"modelName": "h", "handler": manifest_handler, "modelVersion": "1"},
        "archiverVersion": "0.12.0",
    }
    assert names == ({packed} if packed else set())


# --- extra files -------------------------------------------------------------------------------


def _packed(out: Path) -> set[str]:
    with zipfile.ZipFile(out) as zf:
        return set(zf.namelist()) - {"MAR-INF/MANIFEST.json"}


def test_extra_folder_is_flattened_and_filtered(inputs: ModelInputs, tmp_path: Path) -> None:
    out = build(
        model_name="e",
        version="1",
        handler="base_handler",
        extra_files=[str(inputs.extra_dir)],
        export_path=str(tmp_path),
    )
    # Folder contents land at the root with their sub-paths; junk is skipped at every depth.
    assert _packed(out) == {"index_to_name.json", "sub/vocab.txt", "sub/deeper/x.bin"}


def test_extra_files_globs_files_and_comma_string(inputs: ModelInputs, tmp_path: Path) -> None:
    extra = inputs.extra_dir
    spec = f" {extra}/sub/*.txt , {extra}/index_to_name.json,{extra}/*.pyc,{extra}/sub/deeper "
    out = build(
        model_name="g",
        version="1",
        handler="base_handler",
        extra_files=spec,
        export_path=str(tmp_path),
    )
    # A glob match that is a folder is flattened too; *.pyc matches are skipped like folder junk.
    assert _packed(out) == {"vocab.txt", "index_to_name.json", "x.bin"}


def test_explicitly_named_file_is_packed_even_if_hidden(
    inputs: ModelInputs, tmp_path: Path
) -> None:
    # Skip rules are for folder and glob contents; a file the user names is what they asked for.
    out = build(
        model_name="d",
        version="1",
        handler="base_handler",
        extra_files=[str(inputs.extra_dir / ".env")],
        export_path=str(tmp_path),
    )
    assert _packed(out) == {".env"}


def test_stale_mar_inf_in_extra_folder_never_shadows_manifest(
    inputs: ModelInputs, tmp_path: Path
) -> None:
    (tmp_path / "old").mkdir()
    full_build(inputs, tmp_path / "old", "no-archive")
    out = build(
        model_name="n",
        version="9",
        handler="base_handler",
        extra_files=[str(tmp_path / "old" / "m")],
        export_path=str(tmp_path),
    )
    assert read_manifest(out)["model"]["modelName"] == "n"
    with zipfile.ZipFile(out) as zf:
        assert zf.namelist().count("MAR-INF/MANIFEST.json") == 1


def test_later_input_with_same_name_wins(inputs: ModelInputs, tmp_path: Path) -> None:
    # torch-model-archiver copies into one folder, so an extra file replaces the model file.
    override = tmp_path / "other"
    override.mkdir()
    (override / "model.py").write_bytes(b"# from extra\n")
    out = build(
        model_name="o",
        version="1",
        handler="base_handler",
        model_file=str(inputs.model_file),
        extra_files=[str(override)],
        export_path=str(tmp_path),
    )
    with zipfile.ZipFile(out) as zf:
        assert zf.read("model.py") == b"# from extra\n"


@pytest.mark.parametrize("fmt", ["tgz", "no-archive"])
def test_export_folder_inside_extra_folder_is_not_packed(
    inputs: ModelInputs, tmp_path: Path, fmt: str
) -> None:
    full_build(inputs, inputs.extra_dir, fmt)
    # Rebuilding into the folder being packed must not swallow its own previous output.
    out = full_build(inputs, inputs.extra_dir, fmt, force=True)
    files = tree(open_archive(out, tmp_path / "x").model_dir)
    files.pop("MAR-INF/MANIFEST.json")
    assert files == inputs.expected


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("missing.txt", "extra file not found"),
        ("nothing-*.bin", "extra files pattern matches nothing"),
    ],
)
def test_bad_extra_files(tmp_path: Path, spec: str, message: str) -> None:
    with pytest.raises(ArchiveError, match=message):
        build(
            model_name="b",
            version="1",
            handler="base_handler",
            extra_files=[str(tmp_path / spec)],
            export_path=str(tmp_path),
        )
    assert os.listdir(tmp_path) == []


# --- atomicity ---------------------------------------------------------------------------------

# Files that fail half-way through packing: /proc/self/mem fails on read (zip, folder); a sysfs
# attribute is shorter than its stated 4096 bytes, which tarfile reports as an error.
_FAILING_INPUT = {
    "default": "/proc/self/mem",
    "zip-store": "/proc/self/mem",
    "no-archive": "/proc/self/mem",
    "tgz": "/sys/kernel/mm/transparent_hugepage/enabled",
}


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("existing", [False, True])
def test_failed_run_leaves_no_partial_output(
    inputs: ModelInputs, tmp_path: Path, fmt: str, existing: bool
) -> None:
    failing = Path(_FAILING_INPUT[fmt])
    if not failing.is_file():
        pytest.skip(f"{failing} is not available here")
    export = tmp_path / "export"
    export.mkdir()
    if existing:
        full_build(inputs, export, fmt)
    before = tree(export)
    extra = [str(inputs.extra_dir), str(failing)]
    with pytest.raises(ArchiveError, match="cannot write"):
        # The good files come first, so the failure hits an archive already partly written.
        full_build(inputs, export, fmt, extra_files=extra, force=True)
    # Nothing new, nothing half-written; an existing archive survives a failed --force run.
    assert tree(export) == before
    assert sorted(os.listdir(export)) == ([OUTPUT_NAMES[fmt]] if existing else [])


@pytest.mark.parametrize("fmt", FORMATS)
def test_force_replaces_existing_output(inputs: ModelInputs, tmp_path: Path, fmt: str) -> None:
    first = full_build(inputs, tmp_path, fmt, version="1")
    with pytest.raises(ArchiveError, match="already exists"):
        full_build(inputs, tmp_path, fmt, version="2")
    assert full_build(inputs, tmp_path, fmt, version="2", force=True) == first
    assert read_manifest(first)["model"]["modelVersion"] == "2"
    assert sorted(os.listdir(tmp_path)) == sorted(["src", OUTPUT_NAMES[fmt]])


# --- progress ----------------------------------------------------------------------------------

_BUILD_BIG = """
import sys
from archiver import build
build(model_name="big", version="1", handler="base_handler", serialized_file=sys.argv[1],
      export_path=sys.argv[2], archive_format=sys.argv[3])
"""


def _run_build(stderr: int, big: Path, export: Path, fmt: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    cmd = [sys.executable, "-c", _BUILD_BIG, str(big), str(export), fmt]
    return subprocess.Popen(cmd, stderr=stderr, stdout=subprocess.DEVNULL, env=env)


@pytest.mark.parametrize("fmt", ["zip-store", "tgz"])
def test_progress_only_on_a_terminal(tmp_path: Path, fmt: str) -> None:
    big = tmp_path / "big.bin"
    big.write_bytes(b"\x01" * (17 * 1024 * 1024))
    (tmp_path / "a").mkdir()
    piped = _run_build(subprocess.PIPE, big, tmp_path / "a", fmt)
    _, err = piped.communicate(timeout=60)
    assert piped.returncode == 0 and err == b""  # silent when stderr is not a TTY

    master, slave = os.openpty()
    (tmp_path / "b").mkdir()
    proc = _run_build(slave, big, tmp_path / "b", fmt)
    os.close(slave)
    seen = b""
    while True:
        try:
            chunk = os.read(master, 4096)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        seen += chunk
    os.close(master)
    assert proc.wait(timeout=60) == 0
    assert b"packing big.bin" in seen and b"100% (17/17 MiB)" in seen
