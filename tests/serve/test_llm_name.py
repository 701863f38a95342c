"""``serve llm --name``: a name the archiver refuses is a usage error (issue 39, item 9)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from serve.cli.llm import llm


@pytest.mark.parametrize("name", ["../../escape", "/abs", "a/b", ".hidden", ""])
def test_a_bad_name_is_a_usage_error_without_a_traceback(tmp_path: Path, name: str) -> None:
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    store = tmp_path / "store"
    args = [str(tmp_path / "model"), "--name", name, "--model-store", str(store)]
    result = CliRunner().invoke(llm, args)
    assert result.exit_code == 2, result.output
    assert "Invalid value for '--name'" in result.output and "invalid model name" in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert "Traceback" not in result.output
    assert not store.exists()  # nothing written
