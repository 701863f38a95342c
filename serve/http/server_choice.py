"""Which HTTP server runs the apps: ``http_server: auto`` resolved, with the reason said aloud.

uvicorn (httptools parsing, uvloop) answers HTTP/1.1 at ~2× hypercorn's requests per core
(``docs/performance.md``); hypercorn is the one that speaks HTTP/2 (and, with aioquic, HTTP/3).
``auto`` therefore picks uvicorn unless a setting only hypercorn honours is asked for. The choice
is a pure function of the settings and of whether uvicorn can be imported, so it is table-tested
and the CLI can print it before the server starts.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from serve.config import ConfigError

# Config keys that only hypercorn honours → what they ask for. A truthy value means "asked for".
# A setting added for hypercorn alone belongs here, so that ``auto`` keeps honouring it.
HYPERCORN_ONLY: Mapping[str, str] = {
    "http2": "HTTP/2",
}


@dataclass(frozen=True)
class ServerChoice:
    """The HTTP server that will run, and one sentence saying why."""

    kind: str  # "uvicorn" or "hypercorn"
    reason: str

    def describe(self) -> str:
        return f"HTTP server: {self.kind} ({self.reason})"


def hypercorn_only_settings(settings: Any) -> list[str]:
    """The hypercorn-only keys that ``settings`` (a `Config`, or any object) asks for."""
    return [key for key in HYPERCORN_ONLY if getattr(settings, key, None)]


def choose_http_server(
    requested: str, asked: list[str], *, uvicorn_available: bool
) -> ServerChoice:
    """Resolve ``requested`` (``auto``, ``uvicorn`` or ``hypercorn``).

    ``asked``: the hypercorn-only settings in use (`hypercorn_only_settings`). Raises
    `ConfigError` when uvicorn is named together with one of them, or is named but not installed.
    """
    wants = ", ".join(f"{key} ({HYPERCORN_ONLY.get(key, key)})" for key in asked)
    if requested == "hypercorn":
        return ServerChoice("hypercorn", "http_server: hypercorn")
    if requested == "uvicorn":
        if asked:
            raise ConfigError(
                f"Config 'http_server' is uvicorn, but {wants} needs hypercorn: "
                "set http_server to hypercorn or auto"
            )
        if not uvicorn_available:
            raise ConfigError("Config 'http_server' is uvicorn, but uvicorn is not installed")
        return ServerChoice("uvicorn", "http_server: uvicorn")
    if requested != "auto":
        raise ConfigError("Config 'http_server' must be 'auto', 'hypercorn' or 'uvicorn'")
    if asked:
        return ServerChoice("hypercorn", f"auto: {wants} asked for, which only hypercorn serves")
    if not uvicorn_available:
        return ServerChoice("hypercorn", "auto: uvicorn is not installed")
    return ServerChoice("uvicorn", "auto: fastest for HTTP/1.1; set http2: true for hypercorn")


def uvicorn_installed() -> bool:
    return importlib.util.find_spec("uvicorn") is not None


def resolve_http_server(config: Any) -> ServerChoice:
    """`choose_http_server` for a `Config`, looking up what is installed."""
    return choose_http_server(
        config.http_server, hypercorn_only_settings(config), uvicorn_available=uvicorn_installed()
    )
