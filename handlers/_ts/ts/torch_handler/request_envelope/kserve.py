"""``ts.torch_handler.request_envelope.kserve``."""

from __future__ import annotations

from handlers.request_envelope import KServeEnvelope

__all__ = ["KServeEnvelope"]
