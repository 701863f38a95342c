"""What a worker's engine loop (`serve.worker.concurrent.EngineLoop`) needs of a generative
handler, typed: no ``Any`` between them and no probing for attributes.

Importing this module imports no torch: a worker asks any handler whether it is generative
(`GenerativeHandler`, checked with ``isinstance``) before it knows whether the handler uses torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from handlers.generation.params import GenerationRequest

if TYPE_CHECKING:
    from handlers.generation.streams import RequestStreams


@runtime_checkable
class GenerativeHandler(Protocol):
    """A handler whose requests the worker drives through an engine step by step (the built-in
    ``text_generation``, or one written to the same contract)."""

    # The largest request body the model can take (0: no bound): larger ones are refused before
    # their JSON is parsed.
    max_request_bytes: int

    def parse(self, row: Any) -> GenerationRequest:
        """One request row (TorchServe's shape: ``{"body": ...}`` or named fields) as a
        generation request; raises `handlers.exceptions.PredictionException` for bad input."""
        ...

    def request_streams(self) -> RequestStreams | None:
        """The streams over the handler's engine the loop drives, or None when this handler
        runs requests another way (TorchServe's ``continuousBatching`` contract)."""
        ...
