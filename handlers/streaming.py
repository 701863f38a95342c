"""Intermediate (streamed) responses: ``send_intermediate_predict_response``.

TorchServe writes each chunk to the frontend socket at once. Here a chunk goes to
``context.intermediate_sink`` when the worker has set one (it can forward it immediately),
otherwise it is appended to ``context.intermediate_responses`` for the worker to send later.
"""

from __future__ import annotations

import os
from typing import Any


def send_intermediate_predict_response(
    ret: list, req_id_map: dict, message: str, code: int, context: Any
) -> None:
    """Emit one intermediate chunk: ``ret[i]`` is the partial result of batch row ``i``.

    As in TorchServe, only local rank 0 of a multi-process (torchrun) worker emits.
    """
    if str(os.getenv("LOCAL_RANK", "0")) != "0":
        return
    chunk = {
        "results": list(ret),
        "request_ids": dict(req_id_map) if req_id_map is not None else {},
        "message": message,
        "code": code,
    }
    sink = getattr(context, "intermediate_sink", None)
    if sink is not None:
        sink(chunk)
    else:
        context.intermediate_responses.append(chunk)
