"""`serve start` (detached), `serve status` and `serve stop` as a user runs them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx

from tests.support.server import build_archive, echo_archive, pid_alive


def serve(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "serve.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_start_status_stop(tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    echo_archive(store, "echo", config={"minWorkers": 2, "batchSize": 4})
    state = tmp_path / "server.json"
    ports = [
        "--inference-address",
        "http://127.0.0.1:0",
        "--management-address",
        "http://127.0.0.1:0",
        "--metrics-address",
        "http://127.0.0.1:0",
    ]
    started = serve(
        "start",
        "--model-store",
        str(store),
        "--models",
        "echo=echo.mar",
        "--pid-file",
        str(state),
        "--log-dir",
        str(tmp_path / "logs"),
        *ports,
        cwd=tmp_path,
    )
    assert started.returncode == 0, started.stderr
    assert "Lantern is running" in started.stdout
    assert "HTTP server: uvicorn (auto: fastest for HTTP/1.1" in started.stdout
    info = json.loads(state.read_text())
    try:
        # Token auth is on by default: inference needs the key from key_file.json.
        keys = json.loads((tmp_path / "key_file.json").read_text())
        url = f"{info['addresses']['inference']}/predictions/echo"
        assert httpx.post(url, content=b"x").status_code == 401
        resp = httpx.post(
            url,
            content=b"hi",
            headers={
                "Authorization": f"Bearer {keys['inference']['key']}",
                "content-type": "text/plain",
            },
        )
        assert resp.json()["echo"] == "hi"

        again = serve(
            "start", "--model-store", str(store), "--pid-file", str(state), *ports, cwd=tmp_path
        )
        assert again.returncode != 0 and "already running" in again.stderr

        status = serve("status", "--pid-file", str(state), cwd=tmp_path)
        assert status.returncode == 0, status.stderr
        lines = status.stdout.splitlines()
        assert "Healthy" in lines[0]
        row = next(line.split() for line in lines if line.startswith("echo"))
        assert row[:6] == ["echo", "1.0", "*", "2", "2", "4"]
    finally:
        stopped = serve("stop", "--pid-file", str(state), cwd=tmp_path)
    assert stopped.returncode == 0, stopped.stderr
    assert not pid_alive(info["pid"])
    assert not state.exists()
    assert not (tmp_path / "key_file.json").exists()  # keys are removed at shutdown
    assert serve("stop", "--pid-file", str(state), cwd=tmp_path).returncode != 0


def test_bad_config_is_a_one_line_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("batch_sise: 2\n")
    result = serve(
        "start", "--config", str(bad), "--pid-file", str(tmp_path / "s.json"), cwd=tmp_path
    )
    assert result.returncode == 2
    assert "batch_sise" in result.stderr


def test_start_reports_a_model_that_does_not_load(tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    handler = tmp_path / "broken.py"
    handler.write_text("def handle(data, context):\n    raise RuntimeError('no weights')\n")
    build_archive(store, "broken", handler)
    state = tmp_path / "server.json"
    result = serve(
        "start",
        "--model-store",
        str(store),
        "--models",
        "broken.mar",
        "--pid-file",
        str(state),
        "--log-dir",
        str(tmp_path / "logs"),
        "--disable-token-auth",
        "--inference-address",
        "http://127.0.0.1:0",
        "--management-address",
        "http://127.0.0.1:0",
        "--metrics-address",
        "http://127.0.0.1:0",
        cwd=tmp_path,
    )
    try:
        assert result.returncode == 5
        info = json.loads(state.read_text())
        assert f"Error: Lantern (pid {info['pid']}) is running, but 1 model did not load:" in (
            result.stderr.splitlines()
        )
        assert pid_alive(info["pid"])  # like torchserve, the server itself keeps running
        ping = httpx.get(f"{info['addresses']['inference']}/ping")
        assert ping.status_code == 500
    finally:
        serve("stop", "--pid-file", str(state), cwd=tmp_path)
