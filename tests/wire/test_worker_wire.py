"""The messages across a real (torch-free) worker process: the spec on its command line, LOADED or
LOAD_FAILED back, then PREDICT and RESULT with the handler's status, headers and errors."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from serve import __version__
from serve.core.jobs import BatchItem, ItemResult
from serve.wire.errors import ServeError
from serve.worker.process import WorkerProcess, WorkerStartFailed
from tests.support.worker_spec import worker_spec

HANDLER = """
from handlers.exceptions import PredictionException


def handle(data, context):
    if data is None:
        return None
    out = []
    for i, row in enumerate(data):
        body = bytes(row.get("body") or b"")
        if body == b"refuse":
            raise PredictionException("refused", 418)
        context.set_response_header(i, "x-version", context.system_properties["server_version"])
        out.append(body.upper())
    return out
"""


def test_a_batch_crosses_both_ways(tmp_path: Path) -> None:
    handler = tmp_path / "upper_handler.py"
    handler.write_text(HANDLER)

    async def scenario() -> None:
        proc = WorkerProcess("upper_1.0-w0", worker_spec(tmp_path, handler, name="upper"), tmp_path)
        await proc.start(60)
        try:
            assert proc.modules == [] and proc.warmup["requests"] == 0
            items = [
                BatchItem(f"r{i}", {}, [("body", None, b)]) for i, b in enumerate([b"a", b"bc"])
            ]
            outcome = await proc.run_batch(items)
            results = [r for r in outcome.results if isinstance(r, ItemResult)]
            assert [(r.status, r.body, r.headers) for r in results] == [
                (200, b"A", {"x-version": __version__}),
                (200, b"BC", {"x-version": __version__}),
            ]
            assert outcome.timings["handler"] > 0
            refused = await proc.run_batch([BatchItem("r9", {}, [("body", None, b"refuse")])])
            (error,) = refused.results
            assert isinstance(error, ServeError)
            assert (error.status_code, error.error_type, error.message) == (
                418,
                "PredictionException",
                "refused",
            )
        finally:
            await proc.stop(1)

    asyncio.run(scenario())


def test_a_handler_that_does_not_load_is_named_in_load_failed(tmp_path: Path) -> None:
    handler = tmp_path / "broken_handler.py"
    handler.write_text('raise ImportError("cannot load /srv/build/libnative.so")\n')

    async def scenario() -> None:
        proc = WorkerProcess(
            "broken_1.0-w0", worker_spec(tmp_path, handler, name="broken"), tmp_path
        )
        with pytest.raises(WorkerStartFailed) as caught:
            await proc.start(60)
        message = str(caught.value)
        assert message.startswith("ImportError: handler ")
        assert "failed to load" in message and "libnative.so" in message
        assert "/srv/build" not in message

    asyncio.run(scenario())
