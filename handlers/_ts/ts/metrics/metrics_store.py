"""``ts.metrics.metrics_store``: the legacy store name, Lantern's ``MetricsStore``."""

from __future__ import annotations

from handlers.metrics import MetricsStore

__all__ = ["MetricsStore"]
