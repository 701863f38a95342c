"""serve/cli/waiting.py: the line ``serve start`` redraws while it waits, and only on a terminal."""

from __future__ import annotations

import io
from pathlib import Path

from serve.cli.waiting import Pending, StatusLine, expected_names, pending, pip_lines, status_line


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def worker(status: str) -> dict[str, str]:
    return {"status": status}


def test_the_names_asked_for() -> None:
    specs = ["resnet=resnet-18.mar", "store/squeezenet.tar.gz", "all", "https://h/x/bert.mar"]
    assert expected_names(specs) == ["resnet", "squeezenet", "bert"]


def test_what_each_model_is_doing() -> None:
    described = {
        "ready": [{"minWorkers": 1, "workers": [worker("READY"), worker("STARTING")]}],
        "slow": [{"minWorkers": 2, "workers": [worker("STARTING"), worker("STARTING")]}],
        "idle": [{"minWorkers": 0, "workers": []}],
    }
    pip = {"deps": "Collecting pillow", "ready": "Successfully installed x"}
    assert pending(["ready", "slow", "deps", "unzipping", "idle"], described, pip) == [
        Pending("slow", "2 worker(s) starting"),
        Pending("deps", "installing its dependencies: Collecting pillow"),
        Pending("unzipping", "unpacking"),
    ]


def test_the_line_names_the_models_and_the_time_waited() -> None:
    line = status_line([Pending("resnet", "2 worker(s) starting")], 12.4)
    assert line == "waiting for resnet (2 worker(s) starting), 12 s"
    assert status_line([], 3) == "waiting for the server, 3 s"
    long = status_line([Pending("m" * 200, "unpacking")], 61, width=40)
    assert len(long) == 40 and long.endswith("…, 61 s")


def test_the_latest_pip_line_of_each_model(tmp_path: Path) -> None:
    log = tmp_path / "model_log.log"
    log.write_text(
        "2026-01-01 INFO [a] Installing the model's dependencies: pip install\n"
        "2026-01-01 INFO [a] pip: Collecting numpy\n"
        "2026-01-01 INFO [b] pip: Collecting six\n"
        "2026-01-01 INFO [a] pip: Downloading numpy-2.0.whl (16 MB)\n"
    )
    assert pip_lines(log) == {"a": "Downloading numpy-2.0.whl (16 MB)", "b": "Collecting six"}
    assert pip_lines(tmp_path / "missing.log") == {}


def test_the_line_is_redrawn_in_place_on_a_terminal() -> None:
    term = Terminal()
    line = StatusLine(term)
    assert line.due()
    line.show("waiting for resnet (unpacking), 1 s")
    line.show("waiting for x, 2 s")
    line.clear()
    out = term.getvalue()
    assert out.startswith("\rwaiting for resnet (unpacking), 1 s\rwaiting for x, 2 s")
    assert out.endswith("\r")
    assert not line.due()  # not again within half a second


def test_nothing_is_drawn_off_a_terminal() -> None:
    stream = io.StringIO()
    line = StatusLine(stream)
    assert not line.due()
    line.clear()
    assert stream.getvalue() == ""
