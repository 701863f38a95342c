"""The console: a static page on the management port (``console_path``, ``/console`` by default).

`ConsoleMount` wraps the management app inside CORS and outside its token guard:

* ``GET {path}/`` and the page's files are answered here, without a token: they hold no data and
  no secret (the page asks for the tokens and keeps them in the tab's memory);
* ``{path}/inference/...`` is the inference app, guarded as on its own port (the inference key,
  the same body limits and routes), so that the page calls it from its own origin without CORS;
* ``{path}/metrics`` is the metrics app's ``/metrics`` (absent when ``enable_metrics_api`` is off),
  behind the management key as the rest of this port (the server wraps it: `serve.server`),
  which the page polls for rates and latency percentiles;
* everything else, the management API itself included, goes to the management app unchanged:
  scale, register, set-default and unregister obey its token and ``enable_model_api`` as ever.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from serve.http.common import NO_CACHE_HEADERS

FILES = Path(__file__).resolve().parent / "console_files"
_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}
# The page loads only its own files and talks only to its own origin.
_SECURITY_HEADERS = {
    "content-security-policy": (
        "default-src 'self'; img-src 'self' data: blob:; style-src 'self'; "
        "script-src 'self'; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
}


def static_files() -> dict[str, Path]:
    """The page's files by request name (``index.html``, ``app.js``, ...); nothing else."""
    return {p.name: p for p in FILES.iterdir() if p.suffix in _TYPES and p.is_file()}


class ConsoleMount:
    """ASGI: the console's paths under ``path``, the management app for the rest."""

    def __init__(self, management: Any, inference: Any, metrics: Any | None, path: str) -> None:
        self.management = management
        self.inference = inference
        self.metrics = metrics
        self.path = path.rstrip("/")
        self.files = static_files()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or not (path == self.path or path.startswith(self.path + "/")):
            await self.management(scope, receive, send)
            return
        rest = path[len(self.path) :]
        if rest == "/inference" or rest.startswith("/inference/"):
            await self.inference(_moved(scope, rest[len("/inference") :] or "/"), receive, send)
        elif rest == "/metrics" and self.metrics is not None:
            await self.metrics(_moved(scope, "/metrics"), receive, send)
        else:
            await self._static(scope, send, rest)

    async def _static(self, scope: Any, send: Any, rest: str) -> None:
        if rest == "":
            await _answer(send, 308, b"", {"location": self.path + "/"})
            return
        name = rest[1:] or "index.html"
        file = self.files.get(name)
        if file is None:
            await _answer(send, 404, b"Not found", {"content-type": "text/plain"})
        elif scope["method"] not in ("GET", "HEAD"):
            await _answer(send, 405, b"Method not allowed", {"allow": "GET, HEAD"})
        else:
            body = file.read_bytes()
            headers = {"content-type": _TYPES[file.suffix], **_SECURITY_HEADERS}
            await _answer(send, 200, b"" if scope["method"] == "HEAD" else body, headers)


def _moved(scope: Any, path: str) -> Any:
    """``scope`` with ``path`` as its path (the query string stays)."""
    return {**scope, "path": path, "raw_path": path.encode()}


async def _answer(send: Any, status: int, body: bytes, headers: dict[str, str]) -> None:
    fields = {**NO_CACHE_HEADERS, **headers, "content-length": str(len(body))}
    raw = [(k.lower().encode(), v.encode()) for k, v in fields.items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})
