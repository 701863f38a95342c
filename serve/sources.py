"""Turn a model URL from ``--models`` or ``POST /models`` into a local archive, safely.

By default only names inside the model store are accepted. ``http(s)://`` URLs are fetched only when
they fully match one of ``allowed_urls``; the download is size-capped, time-limited and lands in the
model store. Path tricks are refused before anything is read or fetched.
"""

from __future__ import annotations

import asyncio
import os
import re
import tempfile
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path

from serve.config import Config
from serve.errors import BadRequest, InvalidModelUrl, ModelNotFound

_ARCHIVE_SUFFIXES = (".mar", ".tar.gz", ".tgz", ".zip")


class ModelSources:
    """Resolves model URLs against the model store and the ``allowed_urls`` patterns."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.store = Path(config.model_store).resolve() if config.model_store else None
        self.patterns = [re.compile(p, re.IGNORECASE) for p in config.allowed_urls]

    async def resolve(self, url: str) -> Path:
        """The local path of the archive or folder ``url`` names; downloads allowed URLs."""
        url = url.strip()
        if not url:
            raise BadRequest("Parameter url is required.")
        if ".." in url.replace("\\", "/").split("/") or "\x00" in url:
            raise InvalidModelUrl(f"Model URL '{url}' contains a path traversal and was refused.")
        scheme = urllib.parse.urlsplit(url).scheme.lower()
        if scheme in ("http", "https"):
            return await self._download(url)
        if scheme == "file":
            return self._local(urllib.parse.urlsplit(url).path, url, allow_outside=True)
        if scheme and len(scheme) > 1:
            raise InvalidModelUrl(f"Model URL scheme '{scheme}' is not supported.")
        return self._local(url, url, allow_outside=False)

    def _local(self, name: str, url: str, *, allow_outside: bool) -> Path:
        if self.store is None:
            raise BadRequest("No model store is configured; start the server with --model-store.")
        candidate = Path(name)
        if candidate.is_absolute():
            if not (allow_outside and self._allowed(url)):
                raise InvalidModelUrl(
                    f"Model URL '{url}' is outside the model store. Put the archive in "
                    f"{self.store} and register it by file name, or add a matching pattern "
                    "to allowed_urls."
                )
            path = candidate.resolve()
        else:
            path = (self.store / candidate).resolve()
            if not path.is_relative_to(self.store):
                raise InvalidModelUrl(f"Model URL '{url}' escapes the model store.")
        if not path.exists():
            raise ModelNotFound(f"Model archive not found in the model store: {url}")
        return path

    def _allowed(self, url: str) -> bool:
        return any(p.fullmatch(url) for p in self.patterns)

    async def _download(self, url: str) -> Path:
        if not self._allowed(url):
            raise InvalidModelUrl(
                f"Given URL {url} does not match any allowed URL(s). Add a pattern that fully "
                "matches it to allowed_urls (config file or LANTERN_ALLOWED_URLS) to permit it."
            )
        if self.store is None:
            raise BadRequest("Downloads need a model store; start the server with --model-store.")
        name = Path(urllib.parse.unquote(urllib.parse.urlsplit(url).path)).name
        if not name or not name.endswith(_ARCHIVE_SUFFIXES) or name.startswith("."):
            raise InvalidModelUrl(f"URL {url} does not name a model archive (.mar, .tar.gz).")
        target = self.store / name
        if target.exists():
            raise InvalidModelUrl(f"Model file already exists in the model store: {name}")
        await asyncio.to_thread(self._fetch, url, target)
        return target

    def _fetch(self, url: str, target: Path) -> None:
        cap = self.config.download_max_size
        fd, tmp = tempfile.mkstemp(dir=self.store, prefix=".download-")
        try:
            opener = urllib.request.build_opener(_RedirectCheck(self._allowed))
            with (
                os.fdopen(fd, "wb") as out,
                opener.open(url, timeout=self.config.download_timeout) as response,
            ):
                total = 0
                while chunk := response.read(1 << 16):
                    total += len(chunk)
                    if total > cap:
                        raise InvalidModelUrl(f"Download of {url} exceeds the {cap} byte limit.")
                    out.write(chunk)
            os.replace(tmp, target)
        except InvalidModelUrl:
            raise
        except OSError as exc:
            raise BadRequest(f"Failed to download model from {url}: {exc}") from exc
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)


class _RedirectCheck(urllib.request.HTTPRedirectHandler):
    """Follow a redirect only to a URL that allowed_urls also permits."""

    def __init__(self, allowed: Callable[[str], bool]) -> None:
        self.allowed = allowed

    def redirect_request(self, req, fp, code, msg, headers, newurl):  # type: ignore[no-untyped-def]
        if not self.allowed(newurl):
            raise InvalidModelUrl(f"Redirect to {newurl} does not match any allowed URL(s).")
        return super().redirect_request(req, fp, code, msg, headers, newurl)
