"""``ts.metrics.unit``: unit shorthands and their names."""

from __future__ import annotations

from handlers.metrics import UNITS


class Units:
    """``Units().units``: ``{"ms": "Milliseconds", ...}``."""

    def __init__(self) -> None:
        self.units = dict(UNITS)


__all__ = ["Units"]
