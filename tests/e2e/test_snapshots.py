"""Config snapshots across restarts: what the registry held comes back without ``--ncs``.

The servers of this module share one working folder (and so one log folder and snapshot folder):
the first one builds state through the management API; the second restarts from its snapshot,
past corrupt newer ones; the third starts with ``--ncs`` and restores nothing.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.server import LanternServer, echo_archive


@pytest.fixture(scope="module")
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


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory, listener: dict[str, Any]) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("snapshots")
    store = root / "store"
    store.mkdir()
    echo_archive(store)
    echo_archive(root, version="2.0").rename(store / "echo-v2.mar")
    # Not a config file: with --config or --ts-config, a start restores no snapshot (TorchServe).
    env = {"LANTERN_ALLOWED_URLS": json.dumps([re.escape(listener["url"])])}
    args = ["--enable-model-api"]
    return {
        "root": root,
        "store": store,
        "args": args,
        "env": env,
        "snapshots": root / "logs" / "config",
    }


def snapshot_files(folder: Path) -> list[Path]:
    return sorted(folder.glob("*-snapshot.json")) if folder.is_dir() else []


def describe_all(server: LanternServer, name: str) -> dict[str, dict[str, Any]]:
    response = httpx.get(f"{server.management}/models/{name}/all", timeout=10)
    assert response.status_code == 200, response.text
    return {d["modelVersion"]: d for d in response.json()}


def ready(data: dict[str, Any]) -> int:
    return sum(1 for w in data["workers"] if w["status"] == "READY")


def wait_for(check: Any, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        try:
            result = check()
            if result:
                return result
        except (AssertionError, KeyError, httpx.HTTPError):
            if time.monotonic() > deadline:
                raise
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.05)


def test_snapshot_restores_models_versions_default_and_workers(
    setup: dict[str, Any], listener: dict[str, Any]
) -> None:
    root, store, folder = setup["root"], setup["store"], setup["snapshots"]

    # ----- first run: build the state -----------------------------------------------------
    first = LanternServer(root, store, args=setup["args"], env=setup["env"], snapshots=True).start()
    try:
        api = httpx.Client(base_url=first.management, timeout=60)
        calls: list[tuple[str, str, dict[str, Any]]] = [
            ("POST", "/models", {"url": "echo.mar", "initial_workers": 2, "batch_size": 4}),
            ("POST", "/models", {"url": "echo-v2.mar", "initial_workers": 1}),
            ("PUT", "/models/echo/1.0", {"min_worker": 2, "max_worker": 3}),
            ("PUT", "/models/echo/2.0/set-default", {}),
            ("POST", "/models", {"url": "echo.mar", "model_name": "idle"}),
        ]
        for method, path, params in calls:
            response = api.request(method, path, params=params)
            assert response.status_code in (200, 202), response.text
        response = api.post("/models", params={"url": listener["url"], "initial_workers": 1})
        assert response.status_code == 200, response.text
        assert listener["hits"] == 1
        wait_for(lambda: ready(describe_all(first, "echo")["1.0"]) == 2)

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
        api.close()
    finally:
        first.stop()
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

    # ----- second run: restored from the snapshot ------------------------------------------
    console = root / "console.log"
    seen = console.stat().st_size
    before_second = snapshot_files(folder)
    # ghost cannot be restored: /ping says Unhealthy, as for a --models entry that fails.
    second = LanternServer(root, store, args=setup["args"], env=setup["env"], snapshots=True).start(
        healthy=False
    )
    try:

        def restored() -> bool:
            echo = describe_all(second, "echo")
            return (
                ready(echo["1.0"]) == 2
                and ready(echo["2.0"]) == 1
                and bool(ready(describe_all(second, "dl")["1.0"]) == 1)
            )

        wait_for(restored)
        assert second.ping() == 500
        echo = describe_all(second, "echo")
        assert (echo["1.0"]["minWorkers"], echo["1.0"]["maxWorkers"]) == (2, 3)
        assert (echo["1.0"]["batchSize"], echo["2.0"]["batchSize"]) == (4, 1)
        assert all(d["loadedAtStartup"] for d in echo.values())
        default = httpx.get(f"{second.management}/models/echo").json()[0]
        assert default["modelVersion"] == "2.0"
        idle = describe_all(second, "idle")["1.0"]
        assert (idle["minWorkers"], idle["workers"]) == (0, [])
        dl = describe_all(second, "dl")["1.0"]
        assert dl["modelUrl"] == listener["url"]
        assert listener["hits"] == 1  # restored from the store, not downloaded again
        names = [m["modelName"] for m in httpx.get(f"{second.management}/models").json()["models"]]
        assert names == ["dl", "echo", "idle"]
        response = httpx.post(f"{second.inference}/predictions/dl", content=b"back", timeout=30)
        assert response.json()["echo"] == "back"

        log = console.read_bytes()[seen:].decode(errors="replace")
        assert log.count("Skipping corrupt snapshot") == 2
        assert "Could not restore ghost" in log
        # A restore that lost a model (ghost) writes no snapshot: one without ghost would
        # replace the newest good one and drop ghost from every later start.
        assert "Not writing a config snapshot" in log
        assert snapshot_files(folder) == before_second
        # The next change through the API is the user's own: it is written.
        scaled = httpx.put(
            f"{second.management}/models/idle",
            params={"min_worker": 1, "synchronous": "true"},
            timeout=60,
        )
        assert scaled.status_code == 200, scaled.text
        written = [p for p in snapshot_files(folder) if p not in before_second]
        assert written, "the change after the restore was not written"
        newest = written[-1]
        state = json.loads(newest.read_text())["model_snapshot"]
        assert sorted(state["models"]) == ["dl", "echo", "idle"]
        assert state["models"]["echo"]["2.0"]["defaultVersion"] is True
    finally:
        second.stop()

    # ----- third run: --ncs restores nothing --------------------------------------------------
    third = LanternServer(
        root, store, args=setup["args"], env=setup["env"], snapshots=False
    ).start()
    try:
        time.sleep(1.0)  # the restore would have started by now
        assert httpx.get(f"{third.management}/models").json() == {"models": []}
    finally:
        third.stop()
