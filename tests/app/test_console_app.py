"""The console's routes in process (serve/http/console.py): the page's files load without a
token; its inference and metrics mounts are those apps with their own rules; the management API
beside it keeps its token; ``console_path`` moves or removes it. The page in a browser is
tests/e2e/test_console.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from serve.config import Config, ConfigError
from serve.http.console import static_files
from tests.support.inprocess import Lantern, in_process, run, test_config
from tests.support.server import echo_archive


def serve(root: Path, monkeypatch: pytest.MonkeyPatch, test: Any, **overrides: Any) -> None:
    monkeypatch.chdir(root)  # the key file goes to the working directory
    store = root / "store"
    store.mkdir()
    echo_archive(store)

    async def body() -> None:
        config = test_config(root, store, load_models=["echo.mar"], **overrides)
        async with in_process(config) as lantern:
            await test(lantern)

    run(body)


def keys(lantern: Lantern) -> dict[str, str]:
    assert lantern.server.state.auth is not None
    data = json.loads(lantern.server.state.auth.key_file.read_text())
    return {kind: entry["key"] for kind, entry in data.items()}


def test_the_page_loads_without_a_token_and_holds_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def test(lantern: Lantern) -> None:
        page = await lantern.management.get("/console/")
        assert page.status_code == 200
        assert page.headers["content-type"].startswith("text/html")
        assert "default-src 'self'" in page.headers["content-security-policy"]
        for name in static_files():
            served = await lantern.management.get(f"/console/{name}")
            assert served.status_code == 200, name
            for key in keys(lantern).values():
                assert key not in served.text
        moved = await lantern.management.get("/console")
        assert moved.status_code == 308 and moved.headers["location"] == "/console/"
        assert (await lantern.management.get("/console/console.py")).status_code == 404
        assert (await lantern.management.post("/console/index.html")).status_code == 405
        assert (await lantern.management.get("/models")).status_code == 401

    serve(tmp_path, monkeypatch, test, disable_token_authorization=False)


def test_the_inference_mount_is_the_guarded_inference_app(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def test(lantern: Lantern) -> None:
        path = "/console/inference/predictions/echo"
        refused = await lantern.management.post(path, content=b"{}")
        assert refused.status_code == 401
        # The management key is not the inference key: the mount keeps the inference port's rules.
        wrong = {"authorization": f"Bearer {keys(lantern)['management']}"}
        assert (
            await lantern.management.post(path, content=b"{}", headers=wrong)
        ).status_code == 401
        right = {"authorization": f"Bearer {keys(lantern)['inference']}"}
        answer = await lantern.management.post(path, content=b'{"a": 1}', headers=right)
        direct = await lantern.inference.post(
            "/predictions/echo", content=b'{"a": 1}', headers=right
        )
        assert answer.status_code == direct.status_code == 200
        assert answer.json().keys() == direct.json().keys()
        described = await lantern.management.options("/console/inference/")
        assert (
            described.json()["info"]["title"]
            == (await lantern.inference.options("/")).json()["info"]["title"]
        )

    serve(tmp_path, monkeypatch, test, disable_token_authorization=False)


def test_the_metrics_mount_follows_enable_metrics_api(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def on(lantern: Lantern) -> None:
        scraped = await lantern.management.get("/console/metrics")
        assert scraped.status_code == 200
        assert "serve_requests_in_flight" in scraped.text

    (tmp_path / "on").mkdir()
    serve(tmp_path / "on", monkeypatch, on)

    async def off(lantern: Lantern) -> None:
        assert (await lantern.management.get("/console/metrics")).status_code == 404

    (tmp_path / "off").mkdir()
    serve(tmp_path / "off", monkeypatch, off, enable_metrics_api=False)


def test_the_metrics_mount_needs_the_management_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def test(lantern: Lantern) -> None:
        assert (await lantern.management.get("/console/metrics")).status_code == 401
        wrong = {"authorization": "Bearer " + keys(lantern)["inference"]}
        assert (await lantern.management.get("/console/metrics", headers=wrong)).status_code == 401
        good = {"authorization": "Bearer " + keys(lantern)["management"]}
        scraped = await lantern.management.get("/console/metrics", headers=good)
        assert scraped.status_code == 200 and "serve_requests_in_flight" in scraped.text
        assert (await lantern.metrics.get("/metrics")).status_code == 200  # its own port: open

    serve(tmp_path, monkeypatch, test, disable_token_authorization=False)


def test_console_path_moves_or_removes_the_console(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def moved(lantern: Lantern) -> None:
        assert (await lantern.management.get("/ops/console/")).status_code == 200
        assert (await lantern.management.get("/console/")).status_code == 404
        assert (await lantern.management.get("/models")).status_code == 200

    (tmp_path / "moved").mkdir()
    serve(tmp_path / "moved", monkeypatch, moved, console_path="/ops/console")

    async def off(lantern: Lantern) -> None:
        assert (await lantern.management.get("/console/")).status_code == 404
        assert (await lantern.management.get("/models")).status_code == 200

    (tmp_path / "off").mkdir()
    serve(tmp_path / "off", monkeypatch, off, console_path="")


@pytest.mark.parametrize("path", ["console", "/", "//"])
def test_a_console_path_must_be_a_path(path: str) -> None:
    with pytest.raises(ConfigError, match="console_path"):
        Config.from_mapping({"console_path": path})


def test_the_console_answers_with_the_configured_cors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def test(lantern: Lantern) -> None:
        for path in ("/console/", "/console/inference/ping", "/console/metrics"):
            answer = await lantern.management.get(path)
            assert answer.status_code == 200, path
            assert answer.headers["access-control-allow-origin"] == "https://ops.example", path

    serve(tmp_path, monkeypatch, test, cors_allowed_origin="https://ops.example")


def test_register_from_the_console_obeys_enable_model_api(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def test(lantern: Lantern) -> None:
        refused = await lantern.management.post("/models?url=echo.mar&model_name=again")
        assert refused.status_code == 405

    serve(tmp_path, monkeypatch, test)
