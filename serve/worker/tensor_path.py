"""The worker's door to protocol requests (Open Inference Protocol v2, KServe v1, metadata).

``run_protocol_batch`` is called first for every PREDICT frame. A frame without protocol requests
(the ``x-lantern-protocol`` header the frontend sets, see ``serve.wire``) returns None at once
and takes the normal handler path; this module imports nothing heavy, so that check is free for
torch-free workers. Frames with protocol requests go to ``serve.worker.protocol_batch``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from serve.wire import KINDS, PROTOCOL_HEADER
from serve.wire.frames import Frame, MsgType

logger = logging.getLogger("serve.worker")


def run_protocol_batch(
    service: Any,
    context: Any,
    frame: Frame,
    decode: bool,
    fallback: Callable[[Any, Any, Frame, bool], Frame],
) -> Frame | None:
    """The RESULT frame for a batch holding protocol requests, or None when it holds none.

    ``fallback`` (the worker's ``run_batch``) serves the batch's regular requests.
    """
    kinds = [(req.get("headers") or {}).get(PROTOCOL_HEADER) for req in frame.meta["requests"]]
    if not any(kind in KINDS for kind in kinds):
        return None
    try:
        from serve.worker.protocol_batch import run

        return run(service, context, frame, decode, fallback, kinds)
    except Exception as exc:  # a bug here must not take the worker down with the batch
        logger.error("The protocol path failed on a batch", exc_info=True)
        message = f"{type(exc).__name__}: {exc}"
        items = [
            {
                "error": {
                    "code": 500,
                    "type": type(exc).__name__,
                    "message": message,
                    "request_id": req["id"],
                }
            }
            for req in frame.meta["requests"]
        ]
        meta = {"items": items, "timings": {}, "metrics": []}
        return Frame(MsgType.RESULT, frame.seq, meta, tuple(b"" for _ in items))
