"""An ``asyncCommunication`` handler shaped like TorchServe's ``VLLMHandler`` (vLLM needs a GPU).

Like it: ``handle`` is a coroutine; one async engine (here a background task that emits one
"token" per tick to each running request) serves every request in flight; each request awaits its
own output stream and sends every token with ``send_intermediate_predict_response``; the final
answer is the whole text. The body is JSON ``{"prompt", "max_tokens", "gate"}``: a request with
``"gate": true`` does not end until one with ``{"open": true}`` arrives, so tests can hold many
requests in flight without sleeping; ``{"stats": true}`` answers the most that ran at once.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from ts.handler_utils.utils import send_intermediate_predict_response


class _Engine:
    """Tokens for every running request, one per tick (vLLM's AsyncLLMEngine in miniature)."""

    def __init__(self) -> None:
        self.running: set[str] = set()
        self.most = 0
        self.gate = asyncio.Event()

    async def generate(self, request_id: str, prompt: str, n: int, gated: bool) -> Any:
        self.running.add(request_id)
        self.most = max(self.most, len(self.running))
        try:
            for i in range(n):
                await asyncio.sleep(0.01)
                yield f"{prompt}{i} "
            if gated:
                await self.gate.wait()
        finally:
            self.running.discard(request_id)


class AsyncEngineHandler:
    def __init__(self) -> None:
        self.engine: _Engine | None = None
        self.initialized = False

    def initialize(self, context: Any) -> None:
        self.initialized = True

    async def handle(self, data: list, context: Any) -> list:
        if self.engine is None:  # made on the worker's event loop, as vLLM's engine is
            self.engine = _Engine()
        body = data[0].get("body") or data[0].get("data")
        request = json.loads(body) if isinstance(body, (bytes, bytearray, str)) else body
        if request.get("open"):
            self.engine.gate.set()
            return ["opened"]
        if request.get("stats"):
            return [{"most": self.engine.most}]
        request_id = context.get_request_id(0)
        text = []
        stream = self.engine.generate(
            request_id,
            request.get("prompt", "t"),
            int(request.get("max_tokens", 3)),
            bool(request.get("gate")),
        )
        async for token in stream:
            text.append(token)
            send_intermediate_predict_response([token], context.request_ids, "part", 200, context)
        return ["".join(text)]
