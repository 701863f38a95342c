"""The Host check on ports without token authorization (issue 39, item 9: DNS rebinding), in
process: what each port accepts, the switch that turns it off and ``allowed_hosts``."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from serve.http.host_guard import HostPolicy, host_name
from tests.support.inprocess import Lantern, in_process, run, test_config
from tests.support.server import echo_archive


def serve(root: Path, test: Callable[[Lantern], Awaitable[None]], **overrides: Any) -> None:
    store = root / "store"
    store.mkdir(parents=True)
    echo_archive(store)

    async def body() -> None:
        values: dict[str, Any] = {"load_models": ["echo.mar"], "allowed_hosts": [], **overrides}
        async with in_process(test_config(root, store, **values)) as lantern:
            await test(lantern)

    run(body)


def _host(value: str) -> dict[str, str]:
    return {"host": value}


def test_a_foreign_host_is_refused_on_every_port_when_token_auth_is_off(tmp_path: Path) -> None:
    async def test(lantern: Lantern) -> None:
        evil = _host("evil.example:8080")
        for client, path in [
            (lantern.inference, "/ping"),
            (lantern.management, "/models"),
            (lantern.metrics, "/metrics"),
        ]:
            refused = await client.get(path, headers=evil)
            assert refused.status_code == 403, (path, refused.text)
            assert refused.json()["type"] == "HostNotAllowed"
            assert "evil.example" in refused.json()["message"]
        predicted = await lantern.inference.post("/predictions/echo", content=b"x", headers=evil)
        assert predicted.status_code == 403
        oip = await lantern.inference.post("/v2/models/echo/infer", json={}, headers=evil)
        assert oip.status_code == 403 and isinstance(oip.json()["error"], str)
        chat = await lantern.inference.post("/v1/completions", json={}, headers=evil)
        assert chat.status_code == 403 and chat.json()["error"]["type"] == "permission_error"
        for good in ("localhost:8080", "LOCALHOST", "127.0.0.1:8080", "127.0.0.2", "[::1]:8080"):
            resp = await lantern.inference.get("/ping", headers=_host(good))
            assert resp.status_code == 200, (good, resp.text)

    serve(tmp_path, test)


def test_allowed_hosts_and_the_switch(tmp_path: Path) -> None:
    async def listed(lantern: Lantern) -> None:
        ok = await lantern.inference.get("/ping", headers=_host("models.example:443"))
        assert ok.status_code == 200
        assert (await lantern.inference.get("/ping", headers=_host("x.example"))).status_code == 403

    serve(tmp_path / "listed", listed, allowed_hosts=["models.example"])

    async def off(lantern: Lantern) -> None:
        assert (await lantern.inference.get("/ping", headers=_host("x.example"))).status_code == 200

    serve(tmp_path / "off", off, check_host_header=False)

    async def with_tokens(lantern: Lantern) -> None:  # the key stops a rebinding page instead
        resp = await lantern.inference.get("/ping", headers=_host("x.example"))
        assert resp.status_code == 200

    serve(tmp_path / "auth", with_tokens, disable_token_authorization=False)


@pytest.mark.parametrize(
    ("bound", "allowed", "host", "accepted"),
    [
        ("127.0.0.1", [], "127.0.0.1", True),
        ("127.0.0.1", [], "10.0.0.5", False),  # an address this port does not listen on
        ("127.0.0.1", [], "app.localhost", True),
        ("10.0.0.5", [], "10.0.0.5", True),
        ("10.0.0.5", [], "evil.example", False),
        ("myhost.lan", [], "myhost.lan", True),
        ("0.0.0.0", [], "anything.example", True),  # every interface: remote access intended
        ("0.0.0.0", ["svc.local"], "anything.example", False),
        ("0.0.0.0", ["svc.local"], "svc.local", True),
        ("::", ["svc.local"], "10.1.2.3", True),  # an address: no rebinding by name
        ("127.0.0.1", ["*"], "anything.example", True),
    ],
)
def test_which_hosts_a_port_accepts(
    bound: str, allowed: list[str], host: str, accepted: bool
) -> None:
    assert HostPolicy(bound, allowed).accepts(host) is accepted


def test_host_names_are_read_without_port_or_brackets() -> None:
    assert host_name("Example.COM:8080") == "example.com"
    assert host_name("[::1]:8080") == "::1"
    assert host_name("::1") == "::1"
    assert host_name("localhost.") == "localhost"
