"""``ts.handler_utils.micro_batching``: Lantern's ``handlers.micro_batching``."""

from __future__ import annotations

from handlers.micro_batching import HANDLER_METHODS, MicroBatching, WorkerThread

__all__ = ["HANDLER_METHODS", "MicroBatching", "WorkerThread"]
