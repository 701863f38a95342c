"""``ts.torch_handler.request_envelope.json``."""

from __future__ import annotations

from handlers.request_envelope import JSONEnvelope

__all__ = ["JSONEnvelope"]
