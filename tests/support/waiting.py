"""Waiting on an event by polling what shows it (a file, a pid, a metric), with a bound."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def wait_for(
    check: Callable[[], T],
    timeout: float = 60.0,
    what: str = "the condition",
    interval: float = 0.05,
) -> T:
    """Poll ``check`` until it returns something truthy, and return that; an AssertionError
    naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)


def wait_for_workers(server: Any, model: str, count: int, timeout: float = 60.0) -> list[int]:
    """The pids of ``model``'s READY workers once there are ``count`` of them."""

    def ready() -> list[int] | None:
        pids = server.worker_pids(model)
        return pids if len(pids) == count else None

    return wait_for(ready, timeout, f"{count} ready workers of {model}", interval=0.1)
