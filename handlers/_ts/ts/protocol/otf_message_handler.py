"""``ts.protocol.otf_message_handler``: only what handlers import (older streaming examples)."""

from __future__ import annotations

from handlers.streaming import send_intermediate_predict_response

__all__ = ["send_intermediate_predict_response"]
