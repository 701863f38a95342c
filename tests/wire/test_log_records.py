"""The worker's log-line codec: a record crosses the worker's stderr as one line."""

from __future__ import annotations

import logging
import sys

from serve.wire.log_records import WORKER_RECORD_MARK, decode_worker_line, encode_worker_record
from tests.support.log_records import make_record


def test_worker_records_cross_as_one_line() -> None:
    try:
        raise ValueError("bad\ninput")
    except ValueError:
        exc_info = sys.exc_info()
    record = make_record("Handler raised %s", ("ValueError",), request_ids=["r1", "r2"])
    record.exc_info = exc_info
    line = encode_worker_record(record, logging.Formatter())
    assert line.startswith(WORKER_RECORD_MARK) and line.endswith("\n")
    assert line.count("\n") == 1
    level, message, extra = decode_worker_line(line.rstrip("\n")) or (0, "", {})
    assert level == logging.WARNING
    assert message.startswith("Handler raised ValueError\nTraceback (most recent call last):")
    assert message.endswith("ValueError: bad\ninput")
    assert extra == {"worker_logger": "serve.worker", "request_ids": ["r1", "r2"]}


def test_worker_line_decoding_falls_back_to_plain_text() -> None:
    assert decode_worker_line("printed by a handler") is None
    assert decode_worker_line(WORKER_RECORD_MARK + "{not json") is None
    assert decode_worker_line(WORKER_RECORD_MARK + '{"message": "no level"}') is None


def test_long_worker_records_are_cut() -> None:
    line = encode_worker_record(make_record("%s", ("x" * 100_000,)), logging.Formatter())
    assert len(line) < 40_000
    assert decode_worker_line(line.rstrip("\n"))[1].endswith("[truncated]")  # type: ignore[index]
