"""``ts.torch_handler.request_envelope.kservev2``."""

from __future__ import annotations

from handlers.request_envelope import KServev2Envelope

__all__ = ["KServev2Envelope"]
