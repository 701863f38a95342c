"""What ``serve start`` is waiting for, on one redrawn line while a person watches a terminal.

``waiting for resnet18 (installing its dependencies: Collecting pillow), 14 s``: the startup
models without a ready worker, and what each is doing, read from the management API (models
registered, their workers' states) and from the model log (the pip lines of a requirements
install, `serve.core.model_deps`). Nothing is drawn when stderr is not a terminal. The pure parts
(`pending`, `status_line`) are tested without a server.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from serve.cli.server_record import Record

_REDRAW = 0.5  # seconds between redraws
_LOG_TAIL = 64 * 1024  # bytes of the model log read for the latest pip line


@dataclass(frozen=True)
class Pending:
    """A startup model that has no ready worker yet, and what it is doing."""

    model: str
    doing: str


def expected_names(load_models: list[str]) -> list[str]:
    """The model names ``--models`` asks for (``name=url`` or an archive's stem; not ``all``)."""
    names = []
    for spec in load_models:
        if spec == "all":
            continue
        name, sep, url = spec.partition("=")
        if not sep:
            url = name
            name = Path(url.rstrip("/")).name.split(".", 1)[0]
        names.append(name)
    return list(dict.fromkeys(names))


def pending(
    expected: list[str], described: dict[str, list[dict[str, Any]]], pip: dict[str, str]
) -> list[Pending]:
    """The models still loading: ``described`` is each registered model's describe (all
    versions), ``pip`` the latest pip line logged for a model."""
    out = []
    for name in dict.fromkeys([*expected, *described]):
        versions = described.get(name)
        if versions is None:
            line = pip.get(name)
            doing = f"installing its dependencies: {line}" if line else "unpacking"
            out.append(Pending(name, doing))
            continue
        workers = [w for d in versions for w in d.get("workers", [])]
        if any(w.get("status") == "READY" for w in workers):
            continue
        wanted = max((int(d.get("minWorkers") or 0) for d in versions), default=0)
        if wanted == 0 and not workers:
            continue  # registered with no workers: nothing to wait for
        starting = sum(1 for w in workers if w.get("status") == "STARTING")
        doing = f"{starting or len(workers) or wanted} worker(s) starting"
        out.append(Pending(name, doing))
    return out


def status_line(waiting: list[Pending], elapsed: float, width: int = 100) -> str:
    """``waiting for a (..), b (..), 12 s``, cut to ``width`` characters."""
    if waiting:
        models = ", ".join(f"{p.model} ({p.doing})" for p in waiting)
        text = f"waiting for {models}"
    else:
        text = "waiting for the server"
    suffix = f", {elapsed:.0f} s"
    room = max(width - len(suffix), 10)
    if len(text) > room:
        text = text[: room - 1] + "…"
    return text + suffix


def pip_lines(model_log: Path) -> dict[str, str]:
    """The latest ``[model] pip: ...`` line of each model in the model log's tail."""
    try:
        with open(model_log, "rb") as fh:
            size = fh.seek(0, os.SEEK_END)
            fh.seek(max(0, size - _LOG_TAIL))
            tail = fh.read().decode(errors="replace")
    except OSError:
        return {}
    out = {}
    for line in tail.splitlines():
        start = line.find("] pip: ")
        if start < 0:
            continue
        opened = line.rfind("[", 0, start)
        if opened >= 0:
            out[line[opened + 1 : start]] = line[start + len("] pip: ") :].strip()
    return out


class StatusLine:
    """One line on ``stream`` redrawn in place; silent unless ``stream`` is a terminal."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        try:
            self.enabled = self.stream.isatty()
        except (AttributeError, ValueError):
            self.enabled = False
        self._last = 0.0
        self._shown = 0

    def due(self) -> bool:
        """Whether a redraw is due (and wanted at all)."""
        return self.enabled and time.monotonic() - self._last >= _REDRAW

    def show(self, text: str) -> None:
        self._last = time.monotonic()
        pad = " " * max(0, self._shown - len(text))
        self.stream.write(f"\r{text}{pad}")
        self.stream.flush()
        self._shown = len(text)

    def clear(self) -> None:
        if self.enabled and self._shown:
            self.stream.write("\r" + " " * self._shown + "\r")
            self.stream.flush()
            self._shown = 0


def describe_all(record: Record) -> dict[str, list[Any]]:
    """Every registered model's describe (all versions); {} while the API does not answer."""
    from serve.cli.control import CliError, _token, get_json, ssl_context

    management = record.addresses.get("management")
    if not management:
        return {}
    token = _token(record.data.get("key_file"), "management")
    context = ssl_context(record)
    try:
        listed = get_json(f"{management}/models?limit=1000", token, context).get("models", [])
        return {
            m["modelName"]: get_json(f"{management}/models/{m['modelName']}/all", token, context)
            for m in listed
        }
    except (CliError, OSError, ValueError, KeyError):
        return {}
