"""``ts.handler_utils.utils``: streaming partial results."""

from __future__ import annotations

from handlers.streaming import send_intermediate_predict_response

__all__ = ["send_intermediate_predict_response"]
