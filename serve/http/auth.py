"""Token authorisation as TorchServe 0.12 has it, answering 401 instead of its 400.

``key_file.json`` (mode 0600) holds three keys: ``management`` and ``inference``, each with an
``expiration time`` (``token_expiration_min``), and ``API`` (no expiry; only for
``GET /token?type=management|inference`` on the management port, which replaces that key). Clients
send ``Authorization: Bearer <key>``. Health, readiness and API-description routes never need one
(the HTTP guard is `serve.http.token_guard`).
"""

from __future__ import annotations

import datetime as dt
import hmac
import json
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from serve.config import Config
from serve.wire.errors import BadRequest, Unauthorized

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
    """The three keys and the key file; `serve.http.token_guard` checks HTTP requests against
    them, ``serve.grpc.calls`` gRPC calls."""

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
