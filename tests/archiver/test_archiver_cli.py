"""The model-archiver command line: flags, one-line errors, exit codes, no output on failure."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from click.testing import CliRunner

from archiver import read_manifest
from archiver.cli import main

if TYPE_CHECKING:
    from tests.archiver.conftest import ModelInputs

REPO_ROOT = Path(__file__).resolve().parents[2]


def run_cli(args: list[str]) -> tuple[int, str]:
    """Run the command in-process; return (exit code, stderr)."""
    result = CliRunner().invoke(main, args)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, result.stderr


def base_args(inputs: ModelInputs, export: Path) -> list[str]:
    return [
        "--model-name",
        "m",
        "-v",
        "1.0",
        "--handler",
        str(inputs.handler),
        "--serialized-file",
        str(inputs.serialized),
        "--export-path",
        str(export),
    ]


def test_all_flags(inputs: ModelInputs, tmp_path: Path) -> None:
    args = [
        *base_args(inputs, tmp_path),
        "--model-file",
        str(inputs.model_file),
        "--extra-files",
        f"{inputs.extra_dir}/index_to_name.json,{inputs.extra_dir}/sub",
        "--runtime",
        "python3",
        "--archive-format",
        "zip-store",
        "-r",
        str(inputs.requirements),
        "-c",
        str(inputs.config),
    ]
    assert run_cli(args) == (0, "")
    out = tmp_path / "m.mar"
    assert read_manifest(out)["model"] == {
        "modelName": "m",
        "serializedFile": "weights.pth",
        "handler": "my_handler.py",
        "modelFile": "model.py",
        "modelVersion": "1.0",
        "requirementsFile": "requirements.txt",
        "configFile": "model-config.yaml",
    }
    assert read_manifest(out)["runtime"] == "python3"
    with zipfile.ZipFile(out) as zf:
        assert {i.compress_type for i in zf.infolist()} == {zipfile.ZIP_STORED}
        assert {"index_to_name.json", "vocab.txt", "deeper/x.bin"} <= set(zf.namelist())


def test_force_overwrites(inputs: ModelInputs, tmp_path: Path) -> None:
    assert run_cli(base_args(inputs, tmp_path))[0] == 0
    code, err = run_cli(base_args(inputs, tmp_path))
    assert code == 1 and "already exists; use --force" in err
    assert run_cli([*base_args(inputs, tmp_path), "-f"]) == (0, "")


def _replace(args: list[str], flag: str, value: str) -> list[str]:
    args = list(args)
    args[args.index(flag) + 1] = value
    return args


def _drop(args: list[str], flag: str) -> list[str]:
    i = args.index(flag)
    return args[:i] + args[i + 2 :]


# (how to change the valid arguments, exit code, message)
ERROR_CASES = {
    "missing-model-name": (
        lambda a, s: _drop(a, "--model-name"),
        2,
        "Missing option '--model-name'",
    ),
    "missing-version": (lambda a, s: _drop(a, "-v"), 2, "Missing option '-v' / '--version'"),
    "missing-handler": (lambda a, s: _drop(a, "--handler"), 2, "Missing option '--handler'"),
    "bad-model-name": (
        lambda a, s: _replace(a, "--model-name", "bad/name"),
        1,
        "invalid model name 'bad/name'",
    ),
    "bad-model-name-start": (
        lambda a, s: _replace(a, "--model-name", "-m"),
        1,
        "invalid model name '-m'",
    ),
    "bad-runtime": (lambda a, s: [*a, "--runtime", "java"], 2, "Invalid value for '--runtime'"),
    "bad-format": (lambda a, s: [*a, "--archive-format", "rar"], 2, "'--archive-format'"),
    "unknown-flag": (lambda a, s: [*a, "--bogus"], 2, "No such option '--bogus'"),
    "missing-serialized": (
        lambda a, s: _replace(a, "--serialized-file", str(s / "nope.pth")),
        1,
        "serialized file not found",
    ),
    "missing-model-file": (
        lambda a, s: [*a, "--model-file", str(s / "nope.py")],
        1,
        "model file not found",
    ),
    "missing-handler-file": (
        lambda a, s: _replace(a, "--handler", str(s / "nope.py:fn")),
        1,
        "handler file not found",
    ),
    "missing-extra-file": (
        lambda a, s: [*a, "--extra-files", str(s / "nope.txt")],
        1,
        "extra file not found",
    ),
    "missing-requirements": (
        lambda a, s: [*a, "-r", str(s / "nope.txt")],
        1,
        "requirements file not found",
    ),
    "missing-config": (lambda a, s: [*a, "-c", str(s / "nope.yaml")], 1, "config file not found"),
    "unreadable-config": (lambda a, s: [*a, "-c", str(s)], 1, "cannot read config file"),
    "invalid-config": (
        lambda a, s: [*a, "-c", str(s / "bad.yaml")],
        1,
        "invalid YAML: expected ',' or ']'",
    ),
    "config-not-mapping": (
        lambda a, s: [*a, "-c", str(s / "list.yaml")],
        1,
        "model config must be a YAML mapping",
    ),
    "unsafe-yaml-tag": (lambda a, s: [*a, "-c", str(s / "evil.yaml")], 1, "invalid YAML"),
    "export-not-a-folder": (
        lambda a, s: _replace(a, "--export-path", str(s / "model.py")),
        2,
        "'--export-path'",
    ),
    "export-missing": (
        lambda a, s: _replace(a, "--export-path", str(s / "nowhere")),
        1,
        "is not a folder",
    ),
}


@pytest.mark.parametrize("case", ERROR_CASES)
def test_error_cases(inputs: ModelInputs, tmp_path: Path, case: str) -> None:
    src = inputs.root
    (src / "bad.yaml").write_text("batchSize: 4\nminWorkers: [1\n")
    (src / "list.yaml").write_text("- 1\n- 2\n")
    (src / "evil.yaml").write_text("!!python/object/apply:os.system ['touch pwned']\n")
    export = tmp_path / "export"
    export.mkdir()
    change, code, message = ERROR_CASES[case]
    before = sorted(os.listdir(tmp_path)), sorted(os.listdir(src))
    got_code, err = run_cli(change(base_args(inputs, export), src))
    assert got_code == code
    assert err.startswith("model-archiver: error: ") and err.count("\n") == 1, err
    assert message in err
    # Nothing written anywhere: no archive, no temp file, no side effect of a YAML tag.
    assert os.listdir(export) == []
    assert (sorted(os.listdir(tmp_path)), sorted(os.listdir(src))) == before


def _subprocess(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    cmd = [sys.executable, "-m", "archiver", *args]
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=60)


def test_python_dash_m_archiver(inputs: ModelInputs, tmp_path: Path) -> None:
    # Default export path is the current folder.
    args = ["--model-name", "cli", "-v", "3", "--handler", str(inputs.handler)]
    done = _subprocess([*args, "--archive-format", "tgz"], tmp_path)
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
    assert read_manifest(tmp_path / "cli.tar.gz")["model"]["modelVersion"] == "3"
    failed = _subprocess([*args, "--archive-format", "tgz"], tmp_path)
    assert failed.returncode == 1
    assert failed.stderr == (
        "model-archiver: error: cli.tar.gz already exists; use --force to overwrite it\n"
    )
    usage = _subprocess(["-h"], tmp_path)
    assert usage.returncode == 0 and "--extra-files" in usage.stdout


def test_archiver_never_imports_torch() -> None:
    # The server frontend imports the archiver and must stay free of torch.
    code = (
        "import sys, archiver, archiver.cli\n"
        "assert not [m for m in sys.modules if m == 'torch' or m.startswith('torch.')]\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_no_arguments_prints_the_usage() -> None:
    code, err = run_cli([])
    assert code == 2
    lines = err.splitlines()
    assert lines[0].startswith("Usage: ") and lines[0].endswith(" [OPTIONS]")
    assert any(line.strip().startswith("--model-name TEXT") for line in lines)
    assert lines[-1] == "model-archiver: error: Missing option '--model-name'."
