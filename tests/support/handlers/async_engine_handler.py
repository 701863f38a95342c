"""An ``asyncCommunication`` handler shaped like TorchServe's ``VLLMHandler`` (vLLM needs a GPU).

Like it: ``handle`` is a coroutine; one engine on the worker's event loop (here an async
generator of one "token" per tick) serves every request in flight; each request awaits its own
output stream and sends every token with ``send_intermediate_predict_response``; the final
answer is the whole text. The body is JSON ``{"prompt", "max_tokens", "gate"}``: a request with
``"gate": true`` does not end until one with ``{"open": true}`` arrives, so tests can hold many
requests in flight without sleeping; ``{"stats": true}`` answers the most that ran at once.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from ts.handler_utils.utils import send_intermediate_predict_response


class AsyncEngineHandler:
    """One class only: TorchServe's loader takes the module's one class as the handler."""

    def __init__(self) -> None:
        self.running: set[str] = set()  # the engine's requests in flight
        self.loop: asyncio.AbstractEventLoop | None = None  # the one initialize ran on
        self.most = 0
        self.gate: asyncio.Event | None = None
        self.initialized = False

    async def initialize(self, context: Any) -> None:
        """A coroutine, as VLLMHandler's: its engine is made on the loop ``handle`` runs on."""
        await asyncio.sleep(0)
        self.setup(context)
        self.loop = asyncio.get_running_loop()

    def setup(self, context: Any) -> None:
        self.initialized = True

    async def handle(self, data: list, context: Any) -> list:
        if not self.initialized:
            raise RuntimeError("initialize was never awaited")
        if self.loop is not None and asyncio.get_running_loop() is not self.loop:
            raise RuntimeError("handle runs on another event loop than initialize did")
        if self.gate is None:  # made on the worker's event loop, as vLLM's engine is
            self.gate = asyncio.Event()
        body = data[0].get("body") or data[0].get("data")
        request = json.loads(body) if isinstance(body, (bytes, bytearray, str)) else body
        if request.get("open"):
            self.gate.set()
            return ["opened"]
        if request.get("stats"):
            return [{"most": self.most}]
        request_id = context.get_request_id(0)
        text = []
        stream = self.generate(
            request_id,
            request.get("prompt", "t"),
            int(request.get("max_tokens", 3)),
            bool(request.get("gate")),
        )
        async for token in stream:
            text.append(token)
            send_intermediate_predict_response([token], context.request_ids, "part", 200, context)
        return ["".join(text)]

    async def generate(self, request_id: str, prompt: str, n: int, gated: bool) -> Any:
        """One "token" per tick for this request (vLLM's AsyncLLMEngine in miniature)."""
        self.running.add(request_id)
        self.most = max(self.most, len(self.running))
        try:
            for i in range(n):
                await asyncio.sleep(0.01)
                yield f"{prompt}{i} "
            if gated and self.gate is not None:
                await self.gate.wait()
        finally:
            self.running.discard(request_id)
