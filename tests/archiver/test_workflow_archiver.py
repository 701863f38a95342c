"""workflow-archiver: same .war as the real torch-workflow-archiver 0.2.15; safe opening."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from archiver.errors import ArchiveError, ManifestError, UnsafeArchive
from archiver.workflow import WORKFLOW_MANIFEST_PATH, build_workflow, open_workflow
from archiver.workflow_cli import main

# The real torch-workflow-archiver (a dev dependency), through its own entry point: the console
# script of that name may be our alias.
_REAL = (
    "import sys; from workflow_archiver.workflow_packaging import generate_workflow_archive; "
    "sys.argv[0] = 'torch-workflow-archiver'; generate_workflow_archive()"
)
SPEC = b"models:\n  m1:\n    url: m1.mar\ndag:\n  pre: [m1]\n"
HANDLER = b"def pre(data, context):\n    return data\n"


@pytest.fixture
def src(tmp_path: Path) -> Path:
    root = tmp_path / "src"
    root.mkdir()
    (root / "spec.yaml").write_bytes(SPEC)
    (root / "wf_handler.py").write_bytes(HANDLER)
    (root / "labels.json").write_bytes(b'{"0": "cat"}')
    (root / "vocab.txt").write_bytes(b"a\nb\n")
    return root


def flags(src: Path, out: Path) -> list[str]:
    return [
        "--workflow-name",
        "wf",
        "--spec-file",
        str(src / "spec.yaml"),
        "--handler",
        str(src / "wf_handler.py"),
        "--extra-files",
        f"{src / 'labels.json'},{src / 'vocab.txt'}",
        "--export-path",
        str(out),
    ]


def real_archiver(*args: str, cwd: Path) -> None:
    subprocess.run(
        [sys.executable, "-c", _REAL, *args], cwd=cwd, check=True, capture_output=True, timeout=60
    )


def contents(war: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(war) as zf:
        return {i.filename: zf.read(i) for i in zf.infolist()}


def test_same_archive_as_torch_workflow_archiver(src: Path, tmp_path: Path) -> None:
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    ours.mkdir()
    theirs.mkdir()
    result = CliRunner().invoke(main, flags(src, ours))
    assert result.exit_code == 0, result.output
    real_archiver(*flags(src, theirs), cwd=tmp_path)
    a, b = contents(ours / "wf.war"), contents(theirs / "wf.war")
    assert (
        set(a)
        == set(b)
        == {
            "spec.yaml",
            "wf_handler.py",
            "labels.json",
            "vocab.txt",
            WORKFLOW_MANIFEST_PATH,
        }
    )
    for name in set(a) - {WORKFLOW_MANIFEST_PATH}:
        assert a[name] == b[name], name
    ma, mb = json.loads(a[WORKFLOW_MANIFEST_PATH]), json.loads(b[WORKFLOW_MANIFEST_PATH])
    assert list(ma) == list(mb) == ["createdOn", "workflow", "archiverVersion"]
    assert (
        ma["workflow"]
        == mb["workflow"]
        == {
            "workflowName": "wf",
            "specFile": "spec.yaml",
            "handler": "wf_handler.py",
        }
    )
    assert ma["archiverVersion"] == mb["archiverVersion"] == "0.2.15"
    pattern = re.compile(r"\d\d/\d\d/\d{4} \d\d:\d\d:\d\d")
    assert pattern.fullmatch(ma["createdOn"]) and pattern.fullmatch(mb["createdOn"])
    with zipfile.ZipFile(ours / "wf.war") as zf:
        assert {i.compress_type for i in zf.infolist()} == {zipfile.ZIP_DEFLATED}


def test_both_archives_open_the_same(src: Path, tmp_path: Path) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    real_archiver(*flags(src, theirs), cwd=tmp_path)
    opened = open_workflow(theirs / "wf.war", tmp_path / "x")
    assert opened.workflow_name == "wf"
    assert opened.spec_file.read_bytes() == SPEC
    assert opened.handler == "wf_handler.py"
    ours = build_workflow(
        workflow_name="wf2",
        spec_file=str(src / "spec.yaml"),
        handler=str(src / "wf_handler.py"),
        export_path=str(tmp_path),
    )
    assert open_workflow(ours, tmp_path / "y").workflow_name == "wf2"


def test_force_and_refusals(src: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    assert CliRunner().invoke(main, flags(src, out)).exit_code == 0
    again = CliRunner().invoke(main, flags(src, out))
    assert again.exit_code == 1 and "already exists" in again.output
    assert CliRunner().invoke(main, [*flags(src, out), "-f"]).exit_code == 0
    bad_name = CliRunner().invoke(main, [*flags(src, out)[2:], "--workflow-name", "../x"])
    assert bad_name.exit_code == 1 and "invalid model name" in bad_name.output
    (src / "spec.yaml").unlink()
    missing = CliRunner().invoke(main, [*flags(src, out), "-f"])
    assert missing.exit_code == 1 and "spec file not found" in missing.output
    no_handler = CliRunner().invoke(main, ["--workflow-name", "w", "--spec-file", "s.yaml"])
    assert no_handler.exit_code == 2 and "--handler" in no_handler.output


def _zip(path: Path, entries: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in entries.items():
            zf.writestr(name, data)
    return path


GOOD_MANIFEST = json.dumps(
    {
        "createdOn": "01/12/2026 10:00:00",
        "workflow": {"workflowName": "w", "specFile": "spec.yaml", "handler": "h.py"},
        "archiverVersion": "0.2.15",
    }
).encode()


@pytest.mark.parametrize(
    ("entries", "error", "message"),
    [
        (
            {"../evil.py": b"x", WORKFLOW_MANIFEST_PATH: GOOD_MANIFEST},
            UnsafeArchive,
            "escapes",
        ),
        ({"spec.yaml": SPEC, "h.py": HANDLER}, ManifestError, "not a workflow archive"),
        (
            {WORKFLOW_MANIFEST_PATH: b'{"createdOn": "x", "archiverVersion": "0.2.15"}'},
            ManifestError,
            "Missing Workflow entry",
        ),
        (
            {
                WORKFLOW_MANIFEST_PATH: json.dumps(
                    {"createdOn": "x", "workflow": {"workflowName": "w", "specFile": "s.yaml"}}
                ).encode()
            },
            ManifestError,
            "archive version is not defined",
        ),
        ({WORKFLOW_MANIFEST_PATH: GOOD_MANIFEST, "h.py": HANDLER}, ManifestError, "missing"),
    ],
    ids=["zip-slip", "no-manifest", "no-workflow", "no-version", "spec-missing"],
)
def test_open_refuses(
    tmp_path: Path, entries: dict[str, bytes], error: type[ArchiveError], message: str
) -> None:
    war = _zip(tmp_path / "bad.war", entries)
    dest = tmp_path / "dest"
    with pytest.raises(error, match=message):
        open_workflow(war, dest)
    assert not dest.exists() or not any(dest.iterdir())


def test_open_refuses_a_spec_outside_the_archive(tmp_path: Path) -> None:
    manifest = json.loads(GOOD_MANIFEST)
    manifest["workflow"]["specFile"] = "/etc/passwd"
    war = _zip(tmp_path / "w.war", {WORKFLOW_MANIFEST_PATH: json.dumps(manifest).encode()})
    with pytest.raises(ManifestError, match="outside the archive"):
        open_workflow(war, tmp_path / "dest")
