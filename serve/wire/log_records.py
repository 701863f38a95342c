"""The worker's log records on its stderr: one line each, for the frontend's model log.

A worker writes each Python log record as ``WORKER_RECORD_MARK`` + JSON (`encode_worker_record`),
so that a multi-line traceback reaches the model log as one record with its level and request
ids; the frontend decodes it with `decode_worker_line` (anything else on the stream, such as a
handler's ``print``, is a plain line).
"""

from __future__ import annotations

import json
import logging
from typing import Any

# ASCII record separator: no print() or library output starts a line with it.
WORKER_RECORD_MARK = "\x1e"
MAX_WORKER_MESSAGE = 32_000  # stays well under the frontend's 64 KiB line limit


def encode_worker_record(record: logging.LogRecord, formatter: logging.Formatter) -> str:
    """One worker log record as one line for the frontend (traceback included)."""
    message = record.getMessage()
    if record.exc_info:
        message = f"{message}\n{formatter.formatException(record.exc_info)}"
    if len(message) > MAX_WORKER_MESSAGE:
        message = message[:MAX_WORKER_MESSAGE] + " [truncated]"
    data: dict[str, Any] = {"level": record.levelno, "logger": record.name, "message": message}
    request_ids = record.__dict__.get("request_ids")
    if request_ids:
        data["request_ids"] = request_ids
    return WORKER_RECORD_MARK + json.dumps(data, default=str) + "\n"


def decode_worker_line(text: str) -> tuple[int, str, dict[str, Any]] | None:
    """``(level, message, extra)`` of a line from `encode_worker_record`, else None."""
    if not text.startswith(WORKER_RECORD_MARK):
        return None
    try:
        data = json.loads(text[len(WORKER_RECORD_MARK) :])
        level = int(data["level"])
        message = str(data["message"])
    except (ValueError, KeyError, TypeError):
        return None
    extra: dict[str, Any] = {"worker_logger": str(data.get("logger", ""))}
    if isinstance(data.get("request_ids"), list):
        extra["request_ids"] = data["request_ids"]
    return level, message, extra
