"""The ``Host`` check for ports without token authorization (DNS rebinding).

A web page can make a browser send requests to ``http://127.0.0.1:8080`` under a name of its own
(DNS rebinding: ``evil.example`` resolves to the attacker's server first, then to 127.0.0.1), and
read the answers, since the browser takes them for the page's own origin. Such requests carry the
attacker's name in ``Host``. With token authorization on, they lack the key; with it off
(``disable_token_authorization``), this check refuses them: 403 unless ``Host`` names

* a loopback name or address (``localhost``, ``127.0.0.1`` and the rest of 127/8, ``[::1]``);
* the host the port listens on (its address's host, e.g. ``inference_address``);
* a name in ``allowed_hosts`` (``*`` allows any);
* or, on a port that listens on every interface (``0.0.0.0``, ``::``), anything when
  ``allowed_hosts`` is empty (remote access is what such a bind is for, as in Jupyter: clients
  and probes come under names the server cannot know; a rebinding page reaches a server on
  127.0.0.1), and any IP address otherwise.

``check_host_header: false`` turns the check off. A request with no ``Host`` (HTTP/1.0) passes.
"""

from __future__ import annotations

import ipaddress
from typing import Any

from serve.http.edge import answer_error
from serve.identifiers import shown
from serve.wire.errors import error_for_status

_WILDCARDS = frozenset({"0.0.0.0", "::", ""})


def host_name(value: str) -> str:
    """The host of a ``Host`` header value (no port, no brackets), lower-cased."""
    value = value.strip().lower()
    if value.startswith("["):  # [v6]:port
        return value[1 : value.find("]")] if "]" in value else value
    if value.count(":") == 1:  # name:port or v4:port (a bare v6 address has several colons)
        value = value.split(":", 1)[0]
    return value.rstrip(".")


def _ip(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


class HostPolicy:
    """Which ``Host`` values one port accepts (see the module's docstring)."""

    def __init__(self, bound_host: str, allowed_hosts: list[str]) -> None:
        self.bound = host_name(bound_host)
        self.allowed = frozenset(host_name(h) for h in allowed_hosts)
        self.wildcard = self.bound in _WILDCARDS

    def accepts(self, host: str) -> bool:
        if "*" in self.allowed or host in self.allowed or host == self.bound:
            return True
        if host == "localhost" or host.endswith(".localhost"):
            return True
        ip = _ip(host)
        if ip is not None and ip.is_loopback:
            return True
        if self.wildcard:
            return not self.allowed or ip is not None
        return False


class HostGuard:
    """ASGI middleware: 403 for an HTTP request whose ``Host`` the port's policy refuses."""

    def __init__(self, app: Any, policy: HostPolicy, *, protocols: bool) -> None:
        self.app = app
        self.policy = policy
        self.protocols = protocols  # the inference port: /v1 and /v2 answer their own shape

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            host = _host(scope)
            if host is not None and not self.policy.accepts(host_name(host)):
                err = error_for_status(
                    403,
                    f"Host {shown(host_name(host))!r} is not allowed: with token authorization "
                    "off, this server answers only its own addresses, localhost and allowed_hosts.",
                    "HostNotAllowed",
                )
                await answer_error(scope, send, err, protocols=self.protocols)
                return
        await self.app(scope, receive, send)


def _host(scope: Any) -> str | None:
    for name, value in scope["headers"]:
        if name == b"host":
            return str(value.decode("latin-1"))
    return None
