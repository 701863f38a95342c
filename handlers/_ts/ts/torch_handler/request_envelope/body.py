"""``ts.torch_handler.request_envelope.body``."""

from __future__ import annotations

from handlers.request_envelope import BodyEnvelope

__all__ = ["BodyEnvelope"]
