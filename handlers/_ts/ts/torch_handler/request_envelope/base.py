"""``ts.torch_handler.request_envelope.base``."""

from __future__ import annotations

from handlers.request_envelope import BaseEnvelope

__all__ = ["BaseEnvelope"]
