"""Turn a model URL from ``--models``, ``POST /models`` or a snapshot into a local archive, safely.

By default only names inside the model store are accepted. ``http(s)://`` and ``file://`` URLs (and
absolute paths) are used only when they fully match one of ``allowed_urls`` (case-insensitive, as
TorchServe matches them); a download is size-capped, time-limited, follows redirects only to allowed
URLs and lands in the model store under the URL's file name. Path tricks (``..`` in any spelling,
NUL bytes) are refused before anything is read or fetched.
"""

from __future__ import annotations

import asyncio
import http.client
import os
import re
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from serve.config import Config
from serve.wire.errors import BadRequest, Conflict, InvalidModelUrl, ModelNotFound

_ARCHIVE_SUFFIXES = (".mar", ".tar.gz", ".tgz", ".zip")
_SAFE_FILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]*")
_CONFIGURE = (
    "add a regular expression that fully matches it to allowed_urls "
    "(the --config YAML file, or LANTERN_ALLOWED_URLS)."
)


@dataclass(frozen=True)
class ModelLocation:
    """Where a model URL led: the local archive or folder, and how to find it again later."""

    path: Path
    # What a snapshot records to load it again without fetching: the name in the model store,
    # or the allowed absolute path / file URL it was given as.
    store_name: str
    downloaded: bool = False  # fetched into the store by this call (removed if it is no archive)


class ModelSources:
    """Resolves model URLs against the model store and the ``allowed_urls`` patterns."""

    def __init__(
        self,
        config: Config,
        *,
        suffixes: tuple[str, ...] = _ARCHIVE_SUFFIXES,
        kind: str = "model archive",
    ) -> None:
        self.config = config
        self.suffixes = suffixes  # the file names a download may have (.war for workflows)
        self.kind = kind
        self.store = Path(config.model_store).resolve() if config.model_store else None
        self.patterns = [re.compile(p, re.IGNORECASE) for p in config.allowed_urls]

    def allowed(self, url: str) -> bool:
        """Whether ``url`` fully matches one of the ``allowed_urls`` patterns."""
        return any(p.fullmatch(url) for p in self.patterns)

    async def resolve(self, url: str) -> ModelLocation:
        """The local archive or folder ``url`` names; downloads URLs ``allowed_urls`` permits."""
        url = url.strip()
        if not url:
            raise BadRequest("Parameter url is required.")
        check_traversal(url)
        parts = urllib.parse.urlsplit(url)
        scheme = parts.scheme.lower()
        if scheme in ("http", "https"):
            return await self._download(url)
        if scheme == "file":
            if not self.allowed(url):
                raise InvalidModelUrl(_not_allowed(url))
            path = Path(urllib.parse.unquote(parts.path))
            return ModelLocation(self._existing(path.resolve(), url), url)
        if len(scheme) > 1:  # one letter is a Windows drive, not a scheme
            raise InvalidModelUrl(
                f"Model URL scheme '{scheme}' is not supported: use a name in the model store, "
                "or an http(s):// or file:// URL that allowed_urls permits."
            )
        return self._local(url)

    def _local(self, url: str) -> ModelLocation:
        candidate = Path(url)
        if candidate.is_absolute():
            if not (self.allowed(url) or self.allowed(candidate.as_uri())):
                raise InvalidModelUrl(
                    f"Model path {url} is outside the model store. Copy the archive into the model "
                    f"store and register it by file name, or {_CONFIGURE}"
                )
            return ModelLocation(self._existing(candidate.resolve(), url), url)
        if self.store is None:
            raise BadRequest("No model store is configured; start the server with --model-store.")
        path = (self.store / candidate).resolve()
        if not path.is_relative_to(self.store) or path == self.store:
            raise InvalidModelUrl(f"Model URL {url} escapes the model store and was refused.")
        return ModelLocation(self._existing(path, url), path.relative_to(self.store).as_posix())

    def _existing(self, path: Path, url: str) -> Path:
        if not path.exists():
            where = f" in the model store {self.store}" if self.store else ""
            raise ModelNotFound(f"Model archive not found{where}: {url}")
        return path

    async def _download(self, url: str) -> ModelLocation:
        if not self.allowed(url):
            # Refused before any connection: this is the SSRF that CVE-2023-43654 was about.
            raise InvalidModelUrl(_not_allowed(url))
        if self.store is None:
            raise BadRequest("Downloads need a model store; start the server with --model-store.")
        name = urllib.parse.unquote(urllib.parse.urlsplit(url).path).rsplit("/", 1)[-1]
        if not _SAFE_FILE_NAME.fullmatch(name) or not name.lower().endswith(self.suffixes):
            raise InvalidModelUrl(
                f"URL {url} does not end in a {self.kind} file name "
                f"({', '.join(self.suffixes)}) that can be saved in the model store."
            )
        target = self.store / name
        if target.exists():
            raise Conflict(
                f"Model file {name} already exists in the model store: register it by name "
                f"(url={name}) or remove it from the store first."
            )
        await asyncio.to_thread(self._fetch, url, target)
        return ModelLocation(target, name, downloaded=True)

    def _fetch(self, url: str, target: Path) -> None:
        cap = self.config.download_max_size
        timeout = self.config.download_timeout
        deadline = time.monotonic() + timeout
        fd, tmp = tempfile.mkstemp(dir=self.store, prefix=".download-")
        try:
            opener = urllib.request.build_opener(_RedirectCheck(self.allowed))
            with (
                os.fdopen(fd, "wb") as out,
                opener.open(url, timeout=timeout) as response,
            ):
                length = response.headers.get("Content-Length", "")
                if length.isdigit() and int(length) > cap:
                    raise BadRequest(_too_big(url, cap))
                total = 0
                while chunk := response.read(1 << 16):
                    total += len(chunk)
                    if total > cap:
                        raise BadRequest(_too_big(url, cap))
                    if time.monotonic() > deadline:  # a slow drip must not hold the call forever
                        raise BadRequest(
                            f"Download of {url} took longer than download_timeout ({timeout:g} s)."
                        )
                    out.write(chunk)
            # A hard link fails if the name appeared meanwhile: never overwrite a stored archive.
            os.link(tmp, target)
        except FileExistsError:
            raise Conflict(f"Model file {target.name} already exists in the model store.") from None
        except (InvalidModelUrl, BadRequest):
            raise
        except (OSError, http.client.HTTPException, ValueError) as exc:
            raise BadRequest(f"Failed to download model from {url}: {exc}") from exc
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)


def check_traversal(url: str) -> None:
    """Refuse ``..`` path segments in any spelling (``%2e%2e``, backslashes) and NUL bytes."""
    text = url
    for _ in range(3):  # %252e%252e decodes twice
        decoded = urllib.parse.unquote(text)
        if decoded == text:
            break
        text = decoded
    if "\x00" in text or ".." in re.split(r"[/\\?#]", text):
        raise InvalidModelUrl(f"Model URL {url} contains a path traversal ('..') and was refused.")


def _not_allowed(url: str) -> str:
    return f"Given URL {url} does not match any allowed URL(s). To allow it, {_CONFIGURE}"


def _too_big(url: str, cap: int) -> str:
    return (
        f"Download of {url} exceeds download_max_size ({cap} bytes); "
        "raise download_max_size if the archive is meant to be this large."
    )


class _RedirectCheck(urllib.request.HTTPRedirectHandler):
    """Follow a redirect only to a URL that allowed_urls also permits."""

    def __init__(self, allowed: Callable[[str], bool]) -> None:
        self.allowed = allowed

    def redirect_request(
        self,
        req: urllib.request.Request,
        fp: IO[bytes],
        code: int,
        msg: str,
        headers: http.client.HTTPMessage,
        newurl: str,
    ) -> urllib.request.Request | None:
        if not self.allowed(newurl):
            raise InvalidModelUrl(
                f"Redirect to {newurl} does not match any allowed URL(s) and was not followed."
            )
        check_traversal(newurl)
        return super().redirect_request(req, fp, code, msg, headers, newurl)
