"""``python -m bench.dispatch`` runs every placement case at its smallest (no speed asserted)."""

from __future__ import annotations

import pytest

from bench.dispatch import main


def test_every_case_prints_a_figure(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--requests", "64", "--concurrency", "4", "--repeats", "1"]) == 0
    rows = [
        line for line in capsys.readouterr().out.splitlines() if line.startswith(("plain", "seq"))
    ]
    assert len(rows) == 4 and all(float(row.split()[-1]) > 0 for row in rows)
