"""Config snapshots across restarts, in process: what the registry held comes back.

Three servers in turn share one folder (and so one log folder and snapshot folder): the first
builds state through the management API; the second restarts from its snapshot, past corrupt newer
ones; the third starts with snapshots off and restores nothing. Their workers are fakes.
"""

from __future__ import annotations

import json
import logging
import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.inprocess import in_process, run, test_config, until
from tests.support.server import echo_archive


@pytest.fixture
def listener(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """An HTTP server for the one downloaded model; it counts how often it is asked."""
    archive = echo_archive(tmp_path_factory.mktemp("served"), name="dl").read_bytes()
    state: dict[str, Any] = {"hits": 0}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            state["hits"] += 1
            self.send_response(200)
            self.send_header("Content-Length", str(len(archive)))
            self.end_headers()
            self.wfile.write(archive)

        def log_message(self, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    state["url"] = f"http://127.0.0.1:{httpd.server_address[1]}/models/dl.mar"
    yield state
    httpd.shutdown()
    httpd.server_close()


def snapshot_files(folder: Path) -> list[Path]:
    return sorted(folder.glob("*-snapshot.json")) if folder.is_dir() else []


async def describe_all(api: httpx.AsyncClient, name: str) -> dict[str, dict[str, Any]]:
    response = await api.get(f"/models/{name}/all")
    assert response.status_code == 200, response.text
    return {d["modelVersion"]: d for d in response.json()}


def ready(data: dict[str, Any]) -> int:
    return sum(1 for w in data["workers"] if w["status"] == "READY")


def test_snapshot_restores_models_versions_default_and_workers(
    tmp_path: Path, listener: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    store = tmp_path / "store"
    store.mkdir()
    echo_archive(store)
    echo_archive(tmp_path, version="2.0").rename(store / "echo-v2.mar")
    folder = tmp_path / "logs" / "config"

    def config(*, snapshot: bool) -> Any:
        allowed = [re.escape(listener["url"])]
        return test_config(
            tmp_path, store, enable_model_api=True, snapshot=snapshot, allowed_urls=allowed
        )

    async def first_run() -> None:
        async with in_process(config(snapshot=True)) as first:
            api = first.management
            calls: list[tuple[str, str, dict[str, Any]]] = [
                ("POST", "/models", {"url": "echo.mar", "initial_workers": 2, "batch_size": 4}),
                ("POST", "/models", {"url": "echo-v2.mar", "initial_workers": 1}),
                ("PUT", "/models/echo/1.0", {"min_worker": 2, "max_worker": 3}),
                ("PUT", "/models/echo/2.0/set-default", {}),
                ("POST", "/models", {"url": "echo.mar", "model_name": "idle"}),
            ]
            for method, path, params in calls:
                response = await api.request(method, path, params=params)
                assert response.status_code in (200, 202), response.text
            download = {"url": listener["url"], "initial_workers": 1}
            response = await api.post("/models", params=download)
            assert response.status_code == 200, response.text
            assert listener["hits"] == 1
            echo = first.registry.get("echo", "1.0")
            await until(lambda: echo.ready_workers() == 2)

            files = snapshot_files(folder)
            assert files, "no snapshot was written"
            snapshot = json.loads(files[-1].read_text())["model_snapshot"]
            assert snapshot["modelCount"] == 3
            echo = snapshot["models"]["echo"]
            assert echo["1.0"]["defaultVersion"] is False and echo["2.0"]["defaultVersion"] is True
            assert (echo["1.0"]["minWorkers"], echo["1.0"]["maxWorkers"]) == (2, 3)
            assert echo["1.0"]["batchSize"] == 4
            assert echo["1.0"]["marName"] == "echo.mar"
            assert snapshot["models"]["idle"]["1.0"]["minWorkers"] == 0
            dl = snapshot["models"]["dl"]["1.0"]
            assert (dl["marName"], dl["modelUrl"]) == ("dl.mar", listener["url"])
            assert not list(folder.glob("*.tmp")) and not list(folder.glob(".*"))

    run(first_run)
    good = json.loads(snapshot_files(folder)[-1].read_text())

    # Newer snapshots that cannot be used: garbage, the wrong shape, a model whose archive is gone.
    (folder / "99999999999999999999999-snapshot.json").write_text("{not json")
    (folder / "99999999999999999999998-snapshot.json").write_text(
        json.dumps({"model_snapshot": {"models": {"x": "not versions"}}})
    )
    with_ghost = json.loads(json.dumps(good))
    with_ghost["model_snapshot"]["models"]["ghost"] = {
        "1.0": {"defaultVersion": True, "marName": "ghost.mar", "minWorkers": 1}
    }
    (folder / "99999999999999999999997-snapshot.json").write_text(json.dumps(with_ghost))
    before_second = snapshot_files(folder)
    caplog.clear()

    async def second_run() -> None:
        async with in_process(config(snapshot=True)) as second:
            api, infer = second.management, second.inference
            echo = await describe_all(api, "echo")
            assert (ready(echo["1.0"]), ready(echo["2.0"])) == (2, 1)
            assert ready((await describe_all(api, "dl"))["1.0"]) == 1
            # ghost cannot be restored: /ping says Unhealthy, as for a --models entry that fails.
            assert (await infer.get("/ping")).status_code == 500
            assert (echo["1.0"]["minWorkers"], echo["1.0"]["maxWorkers"]) == (2, 3)
            assert (echo["1.0"]["batchSize"], echo["2.0"]["batchSize"]) == (4, 1)
            assert all(d["loadedAtStartup"] for d in echo.values())
            (default,) = (await api.get("/models/echo")).json()
            assert default["modelVersion"] == "2.0"
            idle = (await describe_all(api, "idle"))["1.0"]
            assert (idle["minWorkers"], idle["workers"]) == (0, [])
            dl = (await describe_all(api, "dl"))["1.0"]
            assert dl["modelUrl"] == listener["url"]
            assert listener["hits"] == 1  # restored from the store, not downloaded again
            names = [m["modelName"] for m in (await api.get("/models")).json()["models"]]
            assert names == ["dl", "echo", "idle"]
            response = await infer.post("/predictions/dl", content=b"back")
            assert response.json()["echo"] == "back"

            log = caplog.text
            assert log.count("Skipping corrupt snapshot") == 2
            assert "Could not restore ghost" in log
            # A restore that lost a model (ghost) writes no snapshot: one without ghost would
            # replace the newest good one and drop ghost from every later start.
            assert "Not writing a config snapshot" in log
            assert snapshot_files(folder) == before_second
            # The next change through the API is the user's own: it is written.
            params: dict[str, Any] = {"min_worker": 1, "synchronous": "true"}
            scaled = await api.put("/models/idle", params=params)
            assert scaled.status_code == 200, scaled.text
            written = [p for p in snapshot_files(folder) if p not in before_second]
            assert written, "the change after the restore was not written"
            state = json.loads(written[-1].read_text())["model_snapshot"]
            assert sorted(state["models"]) == ["dl", "echo", "idle"]
            assert state["models"]["echo"]["2.0"]["defaultVersion"] is True

    run(second_run)

    async def third_run() -> None:  # snapshots off (--ncs): nothing is restored
        async with in_process(config(snapshot=False)) as third:
            assert (await third.management.get("/models")).json() == {"models": []}

    run(third_run)
