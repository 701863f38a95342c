"""The benchmark harness end to end, in its smallest configuration (no speed is asserted).

``python -m bench --smoke`` builds the tiny model, runs the raw baseline, the bare ASGI ceiling and
Lantern itself on each HTTP server for about a second each, prints the table and writes the JSON.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.support.server import REPO


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess, dict]:
    out = tmp_path_factory.mktemp("bench")
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "--smoke", "--out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    files = list(out.glob("bench-smoke-*.json"))
    assert len(files) == 1, proc.stdout
    return proc, json.loads(files[0].read_text())


def test_smoke_prints_one_table_with_every_scenario(smoke) -> None:
    proc, data = smoke
    lines = proc.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("scenario"))
    for column in ("req/s", "p50 ms", "p99 ms", "err", "batch", "cpu ms/req", "fe RSS MB"):
        assert column in lines[header]
    rows = lines[header + 2 : header + 2 + len(data["results"])]
    kinds = sorted(line.split()[0] for line in rows)
    assert kinds == ["ceiling", "ceiling", "raw", "served", "served"]
    assert "JSON: " in proc.stdout


def test_smoke_runs_have_no_errors_and_real_figures(smoke) -> None:
    _, data = smoke
    for row in data["results"]:
        assert row["errors"] == 0, row["key"]
        assert row["requests"] > 0 and row["rps"] > 0, row["key"]
        if row["kind"] != "raw":
            assert 0 < row["p50_ms"] <= row["p99_ms"], row["key"]
            assert row["cpu_ms_per_req"] > 0 and row["frontend_rss_mb"] > 0, row["key"]
        if row["kind"] == "served":
            assert row["worker_cpu_ms_per_req"] > 0, row["key"]
            batch = row["batch"]  # read back from the server's serve_batch_size histogram
            assert batch["batches"] > 0 and 1 <= batch["mean"] <= 8, row["key"]


def test_smoke_serves_on_both_http_servers(smoke) -> None:
    _, data = smoke
    served = {row["server"] for row in data["results"] if row["kind"] == "served"}
    assert served == {"hypercorn", "uvicorn"}
    headers = data["meta"]["server_headers"]  # the Server header each Lantern answered with
    assert "hypercorn" in headers["hypercorn"] and "uvicorn" in headers["uvicorn"]
    assert data["meta"]["generator"] in ("wrk", "python")
