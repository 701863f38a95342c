"""Ray's dashboard REST API (what Ray's ``serve deploy`` talks to): one JSON call, no Ray import."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any


class DashboardError(Exception):
    """The dashboard answered an error (``status``), or could not be reached (``status`` None)."""

    def __init__(self, url: str, status: int | None, detail: str) -> None:
        super().__init__(detail)
        self.url = url
        self.status = status
        self.detail = detail


def call(method: str, url: str, body: Any = None) -> Any:
    """``method url`` with ``body`` as JSON; the decoded JSON answer, or None for an empty one."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method)
    request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            text = resp.read()
    except urllib.error.HTTPError as exc:
        raise DashboardError(url, exc.code, exc.read().decode(errors="replace")) from None
    except OSError as exc:
        raise DashboardError(url, None, str(exc)) from None
    return json.loads(text) if text.strip() else None
