"""bench/plots.py: a run's JSON drawn as throughput and latency charts (SVG and PNG), and the
figures docs/performance.md shows, drawn from docs/figures/performance.json."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from bench.plots import main, series_label, write_charts
from tests.support.server import REPO

pytest.importorskip("matplotlib", reason="matplotlib is in the dev extra")

FIGURES = REPO / "docs" / "figures"


def run() -> dict[str, Any]:
    def served(server: str, c: int, rps: float, batching: str) -> dict[str, Any]:
        return {
            "kind": "served",
            "model": "tiny",
            "server": server,
            "workers": 2,
            "threads": 1,
            "batching": batching,
            "concurrency": c,
            "rps": rps,
            "p50_ms": 1000 * c / rps,
            "p90_ms": 1200 * c / rps,
            "p99_ms": 1500 * c / rps,
        }

    rows = [
        {"kind": "raw", "model": "tiny", "server": "-", "workers": 2, "threads": 1,
         "batching": "batch 8", "concurrency": None, "rps": 9000.0},
        {"kind": "ceiling", "model": "bare ASGI", "server": "uvicorn", "batching": "-",
         "concurrency": 32, "rps": 30000.0, "p50_ms": 1.0},
    ]  # fmt: skip
    for server in ("hypercorn", "uvicorn"):
        for c in (1, 8, 32):
            rows.append(served(server, c, 500.0 * c, "batch 8 / 5 ms"))
    meta = {"mode": "quick", "cores": 2, "loadavg": [1.5, 2.0], "commit": "abc1234"}
    return {"meta": meta, "results": rows}


def texts(svg: Path) -> str:
    return " ".join(el.text or "" for el in ET.parse(svg).iter() if el.tag.endswith("text"))


def test_a_run_becomes_two_charts_in_two_formats(tmp_path: Path) -> None:
    written = write_charts(run(), tmp_path, "bench-quick-1")
    assert sorted(p.name for p in written) == [
        "bench-quick-1-latency.png",
        "bench-quick-1-latency.svg",
        "bench-quick-1-throughput.png",
        "bench-quick-1-throughput.svg",
    ]
    for png in tmp_path.glob("*.png"):
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    shown = texts(tmp_path / "bench-quick-1-throughput.svg")
    for label in ("hypercorn 2×1, batch 8 / 5 ms", "uvicorn 2×1, batch 8 / 5 ms", "c=32"):
        assert label in shown
    assert "raw 2×1, batch 8" in shown and "uvicorn bare ASGI" in shown
    assert "quick run" in shown and "abc1234" in shown
    assert "p99" in texts(tmp_path / "bench-quick-1-latency.svg")


def test_redrawing_gives_the_same_svg(tmp_path: Path) -> None:
    first = write_charts(run(), tmp_path / "a", "x")
    second = write_charts(run(), tmp_path / "b", "x")
    for a, b in zip(first, second, strict=True):
        if a.suffix == ".svg":
            assert a.read_bytes() == b.read_bytes()


def test_series_labels() -> None:
    rows = run()["results"]
    assert [series_label(r) for r in rows[:3]] == [
        "raw 2×1, batch 8",
        "uvicorn bare ASGI",
        "hypercorn 2×1, batch 8 / 5 ms",
    ]


def test_the_command_draws_beside_the_json(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    results = tmp_path / "bench-full-2.json"
    results.write_text(json.dumps(run()))
    assert main([str(results)]) == 0
    assert (tmp_path / "bench-full-2-throughput.svg").exists()
    assert str(tmp_path / "bench-full-2-latency.png") in capsys.readouterr().out


def test_the_performance_page_shows_the_charts_of_its_figures() -> None:
    page = (REPO / "docs" / "performance.md").read_text()
    data = json.loads((FIGURES / "performance.json").read_text())
    for chart in ("performance-throughput.svg", "performance-latency.svg"):
        assert f"(figures/{chart})" in page
        shown = texts(FIGURES / chart)
        for model in {r["model"] for r in data["results"] if r.get("p50_ms") is not None}:
            assert model in shown or chart.endswith("throughput.svg")
    shown = texts(FIGURES / "performance-throughput.svg")
    for row in data["results"]:
        assert series_label(row) in shown, series_label(row)
    # The latency chart names only the marks it draws (the page's figures give p50 alone).
    latency = texts(FIGURES / "performance-latency.svg")
    for mark, key in (("p90", "p90_ms"), ("p99", "p99_ms")):
        drawn = any(r.get(key) is not None for r in data["results"])
        assert (mark in latency) is drawn, mark
