"""Log records as a worker's logging makes them, for the log formatter and log-line tests."""

from __future__ import annotations

import logging
from typing import Any


def make_record(
    msg: str = "hello %s", args: tuple[Any, ...] = ("world",), **extra: Any
) -> logging.LogRecord:
    record = logging.LogRecord("serve.worker", logging.WARNING, __file__, 1, msg, args, None)
    record.__dict__.update(extra)
    return record
