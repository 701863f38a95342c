"""Token authorisation as TorchServe 0.12 has it, answering 401 instead of its 400.

``key_file.json`` (mode 0600) holds three keys: ``management`` and ``inference``, each with an
``expiration time`` (``token_expiration_min``), and ``API`` (no expiry; only for
``GET /token?type=management|inference`` on the management port, which replaces that key). Clients
send ``Authorization: Bearer <key>``. Health, readiness and API-description routes never need one.
"""

from __future__ import annotations

import datetime as dt
import hmac
import json
import os
import re
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from serve.config import Config
from serve.http.common import error_response, json_response
from serve.wire.errors import BadRequest, MethodNotAllowed, ServeError, Unauthorized

Scope = dict[str, Any]

# Health, readiness and API descriptions answer without a token (TorchServe guards /ping).
_OPEN_PATHS = re.compile(
    r"^/(ping|api-description|v2/health/(live|ready)|v2/models/[^/]+(/versions/[^/]+)?/ready"
    r"|v2/?)$"
)
# KServe v1 model readiness (GET /v1/models/{m}); `m:predict` and friends are POSTs and guarded.
_READINESS = re.compile(r"^/v1/models/[^/:]+(:ready)?$")
_FAILED = "Token Authorization failed. Token either incorrect, expired, or not provided correctly"


@dataclass
class _Key:
    key: str
    expires: dt.datetime | None

    def matches(self, given: str) -> bool:
        if self.expires is not None and dt.datetime.now(dt.timezone.utc) >= self.expires:
            return False
        return hmac.compare_digest(self.key.encode(), given.encode())

    def as_json(self) -> dict[str, str]:
        data = {"key": self.key}
        if self.expires is not None:
            data["expiration time"] = self.expires.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        return data


class TokenAuth:
    """The three keys, the key file and the ASGI guard that checks them."""

    def __init__(
        self, key_file: Path, ttl_minutes: float, fixed: dict[str, str] | None = None
    ) -> None:
        self.key_file = key_file
        self.ttl = dt.timedelta(minutes=ttl_minutes)
        self.keys = {
            "management": self._new_key(expiring=True),
            "inference": self._new_key(expiring=True),
            "API": self._new_key(expiring=False),
        }
        for kind, key in (fixed or {}).items():
            self.keys[kind] = _Key(key, None)
        self._write()

    @classmethod
    def create(cls, config: Config) -> TokenAuth:
        fixed = {
            kind: key
            for kind, key in (
                ("inference", config.inference_key),
                ("management", config.management_key),
                ("API", config.api_key),
            )
            if key
        }
        return cls(Path(config.key_file).resolve(), config.token_expiration_min, fixed)

    def _new_key(self, *, expiring: bool) -> _Key:
        expires = dt.datetime.now(dt.timezone.utc) + self.ttl if expiring else None
        return _Key(secrets.token_urlsafe(6), expires)

    def _write(self) -> None:
        data = {name: key.as_json() for name, key in self.keys.items()}
        tmp = self.key_file.with_name(f".{self.key_file.name}.tmp")
        tmp.unlink(missing_ok=True)  # a leftover could carry looser permissions than 0600
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump(data, fh, indent=2)
        os.replace(tmp, self.key_file)

    def remove_key_file(self) -> None:
        try:
            self.key_file.unlink()
        except FileNotFoundError:
            pass

    def rotate(self, kind: str) -> dict[str, Any]:
        if kind not in ("management", "inference"):
            raise BadRequest("Parameter type must be 'management' or 'inference'.")
        self.keys[kind] = self._new_key(expiring=True)
        self._write()
        return {kind: self.keys[kind].as_json()}

    def check(self, kind: str, headers: dict[bytes, bytes]) -> None:
        value = headers.get(b"authorization", b"").decode("latin-1")
        scheme, _, token = value.partition(" ")
        if scheme.lower() != "bearer" or not self.keys[kind].matches(token.strip()):
            raise Unauthorized(_FAILED, headers={"WWW-Authenticate": "Bearer"})

    def guard(self, app: Any, kind: str) -> Any:
        """Wrap an ASGI app so every request but the open ones needs ``kind``'s key."""
        auth = self

        async def guarded(scope: Scope, receive: Any, send: Any) -> None:
            if scope["type"] != "http":
                await app(scope, receive, send)
                return
            path, method = scope["path"], scope["method"]
            if _is_open(method, path):
                await app(scope, receive, send)
                return
            headers = dict(scope["headers"])
            try:
                if kind == "management" and path == "/token":
                    auth.check("API", headers)
                    if method != "GET":
                        raise MethodNotAllowed(
                            "Requested method is not allowed, please refer to API document."
                        )
                    await json_response(auth.rotate(_query_type(scope)))(scope, receive, send)
                    return
                auth.check(kind, headers)
            except ServeError as err:
                await error_response(err)(scope, receive, send)
                return
            await app(scope, receive, send)

        return guarded


def _is_open(method: str, path: str) -> bool:
    if _OPEN_PATHS.match(path) or (method == "OPTIONS" and path == "/"):
        return True
    return method in ("GET", "HEAD") and _READINESS.match(path) is not None


def _query_type(scope: Scope) -> str:
    from urllib.parse import parse_qs

    values = parse_qs(scope.get("query_string", b"").decode()).get("type", [""])
    return values[0]
