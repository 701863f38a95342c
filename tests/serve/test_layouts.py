"""The model loader's layouts (serve/store/layouts.py): table tests on folders built in tmp_path.

Recognition looks at names only, so most model files here are empty; opening an implicit archive
links the files and writes a manifest, which is checked as data.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from serve.store.layouts import (
    LayoutError,
    NotAModel,
    open_version,
    recognise,
    scan_store,
)

CONFIG = """
name: "m"
platform: "onnxruntime_onnx"
max_batch_size: 4
input [ { name: "x" data_type: TYPE_FP32 dims: [ 3 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 3 ] label_filename: "labels.txt" } ]
"""


def lay_out(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        if rel.endswith("/"):
            path.mkdir(parents=True, exist_ok=True)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


@pytest.mark.parametrize(
    ("entry", "files", "kind", "name", "versions", "platform"),
    [
        ("m", {"m/config.pbtxt": CONFIG, "m/1/model.onnx": ""}, "versioned", "m", ["1"], None),
        ("m", {"m/1/model.onnx": "", "m/3/model.onnx": ""}, "versioned", "m", ["1", "3"], "onnx"),
        ("m", {"m/1/model.onnx/model.onnx": ""}, "versioned", "m", ["1"], "onnx"),
        ("m", {"m/2/model.pt": ""}, "versioned", "m", ["2"], "pytorch_libtorch"),
        ("m", {"m/1/model.xml": "", "m/1/model.bin": ""}, "versioned", "m", ["1"], "openvino"),
        # OVMS: any file name in the version folder
        ("m", {"m/1/resnet.xml": "", "m/1/resnet.bin": ""}, "versioned", "m", ["1"], "openvino"),
        ("m", {"m/7/anything.onnx": "", "m/notes/": ""}, "versioned", "m", ["7"], "onnx"),
        # a bare model file, and a folder holding one directly
        ("tiny.onnx", {"tiny.onnx": ""}, "file", "tiny", ["1"], "onnx"),
        ("net.pt", {"net.pt": ""}, "file", "net", ["1"], "pytorch_libtorch"),
        ("ir.xml", {"ir.xml": "", "ir.bin": ""}, "file", "ir", ["1"], "openvino"),
        ("flat", {"flat/model.onnx": ""}, "file", "flat", ["1"], "onnx"),
        # TF Serving's versioned store of archives
        ("a", {"a/2/a.mar": ""}, "versioned", "a", ["2"], None),
        ("x.mar", {"x.mar": ""}, "archive", "x", [""], None),
    ],
)
def test_recognise_layouts(
    tmp_path: Path,
    entry: str,
    files: dict[str, str],
    kind: str,
    name: str,
    versions: list[str],
    platform: str | None,
) -> None:
    layout = recognise(lay_out(tmp_path, files) / entry)
    assert (layout.kind, layout.name, sorted(layout.versions)) == (kind, name, versions)
    if platform is not None:
        expected = "onnxruntime_onnx" if platform == "onnx" else platform
        assert layout.model_config["metadata"]["platform"] == expected


def test_default_model_filename_wins(tmp_path: Path) -> None:
    lay_out(
        tmp_path,
        {
            "m/config.pbtxt": 'default_model_filename: "custom.onnx"',
            "m/1/custom.onnx": "",
            "m/1/model.onnx": "",
        },
    )
    assert recognise(tmp_path / "m").versions["1"].path.name == "custom.onnx"


@pytest.mark.parametrize(
    ("files", "entry", "reason"),
    [
        ({"junk/README.txt": ""}, "junk", "not a model folder"),
        ({"junk/1/two.onnx": "", "junk/1/three.onnx": ""}, "junk", "no version folder"),
        ({"notes.txt": ""}, "notes.txt", "not a model archive or model file"),
    ],
)
def test_not_a_model_says_why(
    tmp_path: Path, files: dict[str, str], entry: str, reason: str
) -> None:
    with pytest.raises(NotAModel, match=reason):
        recognise(lay_out(tmp_path, files) / entry)


@pytest.mark.parametrize(
    ("files", "message"),
    [
        ({"m/config.pbtxt": "max_batch_size: [[", "m/1/model.onnx": ""}, "malformed"),
        ({"m/config.pbtxt": "max_batch_size: 2"}, "no version folder of m holds a model"),
        ({"m/config.pbtxt": 'name: "other"', "m/1/model.onnx": ""}, "differs from its folder"),
        ({"m/config.pbtxt": "no_such_field: 1", "m/1/model.onnx": ""}, "no_such_field"),
    ],
)
def test_broken_config_names_the_file(tmp_path: Path, files: dict[str, str], message: str) -> None:
    with pytest.raises(LayoutError, match=message) as caught:
        recognise(lay_out(tmp_path, files) / "m")
    assert str(tmp_path / "m" / "config.pbtxt") in str(caught.value)


@pytest.mark.parametrize(
    ("policy", "served"),
    [
        ("", ["3"]),
        ("version_policy: { latest { num_versions: 2 } }", ["2", "3"]),
        ("version_policy: { all { } }", ["1", "2", "3"]),
        ("version_policy: { specific { versions: [1, 3] } }", ["1", "3"]),
    ],
)
def test_version_policy_picks_versions(tmp_path: Path, policy: str, served: list[str]) -> None:
    files = {f"m/{v}/model.onnx": "" for v in ("1", "2", "3")}
    layout = recognise(lay_out(tmp_path, {**files, "m/config.pbtxt": policy}) / "m")
    assert layout.served_versions() == served
    assert layout.served_versions("2") == ["2"]
    with pytest.raises(LayoutError, match="no version 9"):
        layout.served_versions("9")


def test_implicit_archive(tmp_path: Path) -> None:
    store = lay_out(
        tmp_path / "store",
        {"m/config.pbtxt": CONFIG, "m/labels.txt": "a\nb\nc\n", "m/1/model.onnx": "graph"},
    )
    layout = recognise(store / "m")
    archive = open_version(layout, "1", tmp_path / "dest")
    assert archive.model_dir == (tmp_path / "dest").resolve()
    assert archive.manifest["model"] == {
        "modelName": "m",
        "serializedFile": "model.onnx",
        "handler": "base_handler",
        "modelVersion": "1",
    }
    assert (archive.model_dir / "model.onnx").read_text() == "graph"
    assert (archive.model_dir / "labels.txt").is_file()
    metadata = archive.model_config["metadata"]
    assert metadata["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 3]}]
    assert metadata["maxBatchSize"] == 4


def test_onnx_folder_serves_the_graph_inside(tmp_path: Path) -> None:
    store = lay_out(tmp_path / "store", {"m/1/model.onnx/model.onnx": "", "m/1/model.onnx/w": ""})
    archive = open_version(recognise(store / "m"), "1", tmp_path / "dest")
    assert archive.manifest["model"]["serializedFile"] == "model.onnx/model.onnx"


def test_ir_without_weights_names_the_file(tmp_path: Path) -> None:
    store = lay_out(tmp_path / "store", {"m/1/model.xml": "<net/>"})
    layout = recognise(store / "m")
    with pytest.raises(LayoutError, match=r"model\.xml: its weights file model\.bin is missing"):
        open_version(layout, "1", tmp_path / "dest")
    assert not (tmp_path / "dest").exists()


def test_scan_store_lists_models_and_skips_the_rest(tmp_path: Path) -> None:
    store = lay_out(
        tmp_path,
        {
            "a.mar": "",
            "bare.onnx": "",
            "ir.xml": "",
            "ir.bin": "",
            "triton/config.pbtxt": CONFIG,
            "triton/1/model.onnx": "",
            "broken/config.pbtxt": "max_batch_size: [[",
            "junk/README.txt": "",
            "notes.txt": "",
            ".hidden/1/model.onnx": "",
        },
    )
    listing = scan_store(store)
    assert listing.models == ["a.mar", "bare.onnx", "broken", "ir.xml", "triton"]
    assert [name for name, _ in listing.skipped] == ["junk", "notes.txt"]
    assert all(str(store) not in reason for _, reason in listing.skipped)


def test_empty_or_missing_store(tmp_path: Path) -> None:
    assert scan_store(tmp_path).models == []
    assert scan_store(tmp_path / "missing").skipped == []


def test_startup_report_lines_name_skipped_entries_and_notes() -> None:
    from serve.cli.startup_report import StartupReport, report_lines

    report = StartupReport(skipped=[("junk", "not a model folder")], notes=["--models all ..."])
    again = StartupReport.from_dict(report.as_dict())
    assert report_lines(again) == [
        "Skipped junk in the model store: not a model folder",
        "--models all ...",
    ]
