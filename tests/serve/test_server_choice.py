"""`http_server: auto`: which HTTP server runs for which settings, and the errors for conflicts."""

from __future__ import annotations

import pytest

from serve.config import Config, ConfigError
from serve.http.server_choice import choose_http_server, hypercorn_only_settings

# requested, hypercorn-only settings asked for, uvicorn installed → server, words in the reason
CHOICES = [
    ("auto", [], True, "uvicorn", "auto: fastest for HTTP/1.1"),
    ("auto", ["http2"], True, "hypercorn", "http2 (HTTP/2) asked for"),
    ("auto", [], False, "hypercorn", "uvicorn is not installed"),
    ("auto", ["http2"], False, "hypercorn", "http2 (HTTP/2) asked for"),
    ("hypercorn", [], True, "hypercorn", "http_server: hypercorn"),
    ("hypercorn", ["http2"], True, "hypercorn", "http_server: hypercorn"),
    ("uvicorn", [], True, "uvicorn", "http_server: uvicorn"),
]


@pytest.mark.parametrize(("requested", "asked", "available", "kind", "reason"), CHOICES)
def test_choice(requested: str, asked: list[str], available: bool, kind: str, reason: str) -> None:
    choice = choose_http_server(requested, asked, uvicorn_available=available)
    assert choice.kind == kind
    assert reason in choice.reason
    assert choice.describe().startswith(f"HTTP server: {kind} (")


# requested, asked, uvicorn installed → words in the ConfigError
CONFLICTS = [
    ("uvicorn", ["http2"], True, "http2 (HTTP/2) needs hypercorn"),
    ("uvicorn", [], False, "uvicorn is not installed"),
    ("h2o", [], True, "must be 'auto', 'hypercorn' or 'uvicorn'"),
]


@pytest.mark.parametrize(("requested", "asked", "available", "message"), CONFLICTS)
def test_conflicts_are_config_errors(
    requested: str, asked: list[str], available: bool, message: str
) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        choose_http_server(requested, asked, uvicorn_available=available)


def test_auto_is_the_default_and_http2_is_read_from_the_config() -> None:
    assert Config().http_server == "auto"
    assert hypercorn_only_settings(Config()) == []
    config = Config.load(env={"LANTERN_HTTP2": "true"})
    assert hypercorn_only_settings(config) == ["http2"]
    with pytest.raises(ConfigError, match="http_server"):
        Config.load(overrides={"http_server": "nginx"})
