"""The worker's door to protocol requests (Open Inference Protocol v2, KServe v1, metadata).

``run_protocol_batch`` is called first for every batch. A batch without protocol requests (the
``x-lantern-protocol`` header the frontend sets, see ``serve.wire``) returns None at once and
takes the normal handler path; this module imports nothing heavy, so that check is free for
torch-free workers. Batches with protocol requests go to ``serve.worker.protocol_batch``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from serve.wire import KINDS, PROTOCOL_HEADER
from serve.wire.messages import BatchResult, ErrorItem, PredictItem

logger = logging.getLogger("serve.worker")

RunItems = Callable[[Any, Any, list[PredictItem], bool], BatchResult]


def run_protocol_batch(
    service: Any, context: Any, requests: list[PredictItem], decode: bool, fallback: RunItems
) -> BatchResult | None:
    """The result of a batch holding protocol requests, or None when it holds none.

    ``fallback`` (the worker's ``run_items``) serves the batch's regular requests.
    """
    kinds = [req.headers.get(PROTOCOL_HEADER) for req in requests]
    if not any(kind in KINDS for kind in kinds):
        return None
    try:
        from serve.worker.protocol_batch import run

        return run(service, context, requests, decode, fallback, kinds)
    except Exception as exc:  # a bug here must not take the worker down with the batch
        logger.error("The protocol path failed on a batch", exc_info=True)
        message = f"{type(exc).__name__}: {exc}"
        return BatchResult(
            [ErrorItem(500, type(exc).__name__, message, req.request_id) for req in requests]
        )
