"""Logging presets: the server log, the access log and the model (worker) log.

Files under ``--log-dir``: ``lantern.log`` (everything else), ``access_log.log`` (logger
``serve.access``, one line per request) and ``model_log.log`` (logger ``serve.worker``: each
worker's stdout, stderr and Python logging, tagged with model, version and worker id). Plain text
by default, one JSON object per line with ``log_format: json``.

Workers write each Python log record to stderr as one line that the frontend decodes into a
record of the model log (the codec is `serve.wire.log_records`).
"""

from __future__ import annotations

import json
import logging
import logging.config
import logging.handlers
import os
import threading
import time
from pathlib import Path
from typing import Any

from serve.log_safety import escape_args, is_plain

ACCESS_LOGGER = "serve.access"
MODEL_LOGGER = "serve.worker"
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


class TextFormatter(logging.Formatter):
    """``time LEVEL logger message``; worker records get ``[model version worker]`` first."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s %(message)s")
        self._second: tuple[int, str] = (-1, "")  # one tuple: formatters are shared by threads

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        # strftime once a second rather than once a record: the access log writes many.
        second = int(record.created)
        cached = self._second
        if cached[0] != second:
            cached = (second, time.strftime("%Y-%m-%d %H:%M:%S", self.converter(second)))
            self._second = cached
        return f"{cached[1]},{int(record.msecs):03d}"

    def format(self, record: logging.LogRecord) -> str:
        # Client-supplied values arrive as args: one record stays one line (serve.log_safety).
        # A worker's own records keep their text: it is the handler's, tracebacks included.
        args = record.args
        if not args or "worker_id" in record.__dict__ or is_plain(args):
            return super().format(record)
        record.args = escape_args(args)
        try:
            return super().format(record)
        finally:
            record.args = args

    def formatMessage(self, record: logging.LogRecord) -> str:
        worker = record.__dict__.get("worker_id")
        if worker is None:
            return super().formatMessage(record)
        message = record.message
        model, version = record.__dict__.get("model", "-"), record.__dict__.get("version", "-")
        record.message = f"[{model} {version} {worker}] {message}"
        try:
            return super().formatMessage(record)
        finally:
            record.message = message


_JSON = json.JSONEncoder(default=str)  # one encoder: json.dumps(default=) builds one per call


class JsonFormatter(logging.Formatter):
    """One JSON object per line, with the record's ``extra`` fields kept."""

    _SKIP = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}

    def __init__(self) -> None:
        super().__init__()
        self._second: tuple[int, str] = (-1, "")

    def format(self, record: logging.LogRecord) -> str:
        second = int(record.created)
        cached = self._second
        if cached[0] != second:
            cached = (second, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second)))
            self._second = cached
        fields = record.__dict__
        data: dict[str, Any] = {
            "time": f"{cached[1]}.{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key in fields.keys() - self._SKIP:
            data[key] = fields[key]
        if record.exc_info:
            data["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            data["stack"] = self.formatStack(record.stack_info)
        return _JSON.encode(data)


class LogFile(logging.handlers.WatchedFileHandler):
    """A file that is reopened after logrotate moves it, checked at most once a second
    (``WatchedFileHandler`` calls ``os.stat`` for every record), and that rotates itself at
    ``max_bytes`` (``name.1`` ... ``name.<backup_count>``; 0 bytes: never)."""

    _checked = 0.0

    def __init__(
        self, filename: str, *, max_bytes: int = 0, backup_count: int = 5, **kwargs: Any
    ) -> None:
        super().__init__(filename, **kwargs)
        self.max_bytes = max_bytes
        self.backup_count = backup_count

    def emit(self, record: logging.LogRecord) -> None:
        if record.created - self._checked >= 1.0 or record.created < self._checked:
            self._checked = record.created
            self.reopenIfNeeded()
        if self.max_bytes > 0 and self.stream is not None:
            try:
                if self.stream.tell() >= self.max_bytes:
                    self.acquire()
                    try:
                        self._rotate()
                    finally:
                        self.release()
            except (OSError, ValueError):
                self.handleError(record)
        logging.FileHandler.emit(self, record)

    def _rotate(self) -> None:
        """``name`` -> ``name.1`` -> ... -> ``name.<backup_count>`` (the oldest is dropped)."""
        if self.stream is not None:
            self.stream.close()
            self.stream = None
        rotate_files(Path(self.baseFilename), self.backup_count)
        self.stream = self._open()
        self._statstream()


def rotate_files(path: Path, backup_count: int) -> None:
    """Shift ``path`` to ``path.1`` and the older copies up; without backups, just truncate."""
    if backup_count <= 0:
        path.unlink(missing_ok=True)
        return
    for i in range(backup_count - 1, 0, -1):
        older = path.with_name(f"{path.name}.{i}")
        if older.exists():
            os.replace(older, path.with_name(f"{path.name}.{i + 1}"))
    if path.exists():
        os.replace(path, path.with_name(f"{path.name}.1"))


class BufferedLogFile(LogFile):
    """A `LogFile` written in the background: ``emit`` only fills a buffer, and a daemon thread
    flushes it every ``interval`` seconds (and at close). The access log writes a line per
    request; a write and flush on the event loop for each cost a quarter of the frontend."""

    def __init__(self, filename: str, interval: float = 0.2, **kwargs: Any) -> None:
        super().__init__(filename, **kwargs)
        self.interval = interval
        self._dirty = False
        self._closed = threading.Event()
        threading.Thread(target=self._flush_loop, name="access-log-flush", daemon=True).start()

    def flush(self) -> None:
        self._dirty = True  # StreamHandler.emit flushes after every record: defer it

    def _flush_loop(self) -> None:
        while not self._closed.wait(self.interval):
            if self._dirty:
                self.acquire()
                try:
                    self._dirty = False
                    if self.stream is not None:
                        self.stream.flush()
                finally:
                    self.release()

    def close(self) -> None:
        self._closed.set()
        self.acquire()
        try:
            if self.stream is not None:
                self.stream.flush()
        finally:
            self.release()
        super().close()


def setup_logging(
    log_dir: str | Path | None,
    *,
    level: str = "INFO",
    fmt: str = "text",
    console: bool = True,
    access_log: bool = True,
    max_bytes: int = 0,
    backup_count: int = 5,
) -> None:
    """Send server, access and model logs to files under ``log_dir`` (and the console).

    ``level`` applies to the server and model logs; the access log is on (INFO) or off. Each
    file rotates at ``max_bytes`` keeping ``backup_count`` old copies (0 bytes: never).
    """
    level = level.upper()
    formatter = {"()": JsonFormatter} if fmt == "json" else {"()": TextFormatter}
    handlers: dict[str, dict[str, Any]] = {}
    targets: dict[str, list[str]] = {"root": [], ACCESS_LOGGER: [], MODEL_LOGGER: []}
    if console:
        handlers["console"] = {
            "class": "logging.StreamHandler",
            "formatter": "main",
            "stream": "ext://sys.stderr",
        }
        for key, names in targets.items():
            # A line per request on the console too would double the access log's cost;
            # with a log folder it goes to access_log.log only.
            if key != ACCESS_LOGGER or not log_dir:
                names.append("console")
    if log_dir:
        Path(log_dir).mkdir(parents=True, exist_ok=True)
        for key, filename in (
            ("root", "lantern.log"),
            (ACCESS_LOGGER, "access_log.log"),
            (MODEL_LOGGER, "model_log.log"),
        ):
            handlers[f"file_{filename}"] = {
                # reopened after logrotate; the access log is flushed in the background
                "class": "serve.logs.BufferedLogFile"
                if key == ACCESS_LOGGER
                else "serve.logs.LogFile",
                "filename": str(Path(log_dir) / filename),
                "formatter": "main",
                "max_bytes": max_bytes,
                "backup_count": backup_count,
            }
            targets[key].append(f"file_{filename}")
    logging.config.dictConfig(
        {
            "version": 1,
            "disable_existing_loggers": False,
            "formatters": {"main": formatter},
            "handlers": handlers,
            "root": {"level": level, "handlers": targets["root"]},
            "loggers": {
                ACCESS_LOGGER: {
                    # Off is above CRITICAL, so isEnabledFor() spares the request path entirely.
                    "level": "INFO" if access_log else logging.CRITICAL + 1,
                    "handlers": targets[ACCESS_LOGGER],
                    "propagate": False,
                },
                MODEL_LOGGER: {
                    "level": level,
                    "handlers": targets[MODEL_LOGGER],
                    "propagate": False,
                },
                # Our own access log replaces the servers' (and costs one log call).
                "hypercorn.access": {"level": "WARNING"},
                "uvicorn.access": {"level": "WARNING"},
                # Each of the three ports' servers says "Started server process", "Shutting
                # down" ... at INFO, the same line three times; serve.server says it once.
                "hypercorn.error": {"level": "WARNING"},
                "uvicorn.error": {"level": "WARNING"},
            },
        }
    )
