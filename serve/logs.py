"""Logging presets: the server log, the access log and the model (worker) log."""

from __future__ import annotations

import json
import logging
import logging.config
import time
from pathlib import Path
from typing import Any

ACCESS_LOGGER = "serve.access"
MODEL_LOGGER = "serve.worker"


class JsonFormatter(logging.Formatter):
    """One JSON object per line, with the record's ``extra`` fields kept."""

    _SKIP = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}

    def format(self, record: logging.LogRecord) -> str:
        data: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        data.update({k: v for k, v in vars(record).items() if k not in self._SKIP})
        if record.exc_info:
            data["exception"] = self.formatException(record.exc_info)
        return json.dumps(data, default=str)


def setup_logging(
    log_dir: str | Path | None, *, level: str = "INFO", fmt: str = "text", console: bool = True
) -> None:
    """Send server, access and model logs to files under ``log_dir`` (and the console)."""
    formatter = (
        {"()": JsonFormatter}
        if fmt == "json"
        else {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}
    )
    handlers: dict[str, dict[str, Any]] = {}
    targets: dict[str, list[str]] = {"root": [], ACCESS_LOGGER: [], MODEL_LOGGER: []}
    if console:
        handlers["console"] = {
            "class": "logging.StreamHandler",
            "formatter": "main",
            "stream": "ext://sys.stderr",
        }
        for names in targets.values():
            names.append("console")
    if log_dir:
        Path(log_dir).mkdir(parents=True, exist_ok=True)
        for key, filename in (
            ("root", "lantern.log"),
            (ACCESS_LOGGER, "access_log.log"),
            (MODEL_LOGGER, "model_log.log"),
        ):
            handlers[f"file_{filename}"] = {
                "class": "logging.handlers.WatchedFileHandler",
                "filename": str(Path(log_dir) / filename),
                "formatter": "main",
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
                    "level": "INFO",
                    "handlers": targets[ACCESS_LOGGER],
                    "propagate": False,
                },
                MODEL_LOGGER: {
                    "level": "INFO",
                    "handlers": targets[MODEL_LOGGER],
                    "propagate": False,
                },
                "hypercorn.access": {"level": "WARNING"},
            },
        }
    )
