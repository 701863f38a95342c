"""Waiting on an event by polling what shows it (a file, a pid, a metric), with a bound."""

from __future__ import annotations

import asyncio
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


async def until(
    check: Callable[[], object],
    timeout: float = 5.0,
    what: str = "the condition",
    interval: float = 0.0,
) -> None:
    """Let the event loop run until ``check()`` holds; an AssertionError naming ``what`` after
    ``timeout`` seconds (``asyncio.timeout`` would do, but is Python 3.11+)."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        await asyncio.sleep(interval)


def wait_for_workers(server: Any, model: str, count: int, timeout: float = 60.0) -> list[int]:
    """The pids of ``model``'s READY workers once there are ``count`` of them."""

    def ready() -> list[int]:
        pids: list[int] = server.worker_pids(model)
        return pids if len(pids) == count else []

    return wait_for(ready, timeout, f"{count} ready workers of {model}", interval=0.1)
