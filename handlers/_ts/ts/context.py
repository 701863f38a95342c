"""``ts.context``: TorchServe's Context, backed by Lantern's."""

from __future__ import annotations

from handlers.context import Context, RequestProcessor

__all__ = ["Context", "RequestProcessor"]
