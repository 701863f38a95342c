"""A time bound on pure-Python work that may never end (a chat template's loops).

A chat template is Jinja compiled to Python and run in Jinja's sandbox, which stops a template
from reaching the system but not from looping: ``range`` is capped at 100,000 items, yet two
nested loops already make 10**10 turns. A thread cannot be stopped from outside, so `time_limit`
installs a trace function on the calling thread for the length of the block: at each line the
block's Python code runs (the template's compiled code included) it checks the clock, and past
the bound it raises `TimeLimitExceeded` there, which unwinds the template like any error. The cost
is paid by that thread only and only inside the block (a few times slower Python: microseconds
for a usual template). What it cannot stop is one long C call (``'x' * 10**10``); the worker's
memory cap (``workerMaxRssMb``) is the bound there.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

# A block that runs longer than PAUSE_AFTER (no usual template does) sleeps PAUSE every
# PAUSE_EVERY seconds: a thread busy in Python holds the GIL for up to the switch interval (5 ms)
# each time another thread wants it back, and the engine's step wants it back after every torch
# call, so a runaway template beside it made a neighbour's tokens ~20x slower; pausing hands the
# GIL over at once.
PAUSE_AFTER = 0.02
PAUSE_EVERY = 0.001
PAUSE = 0.004


class TimeLimitExceeded(Exception):
    """The block ran past its time bound."""


@contextmanager
def time_limit(seconds: float, what: str) -> Iterator[None]:
    """Run the block with a bound of ``seconds``; past it, `TimeLimitExceeded` (naming ``what``)
    is raised at the next line of Python the block runs on this thread."""
    start = time.monotonic()
    end = start + seconds
    next_pause = [start + PAUSE_AFTER]

    def check(frame: FrameType, event: str, arg: Any) -> Any:
        now = time.monotonic()
        if now > end:
            raise TimeLimitExceeded(f"{what} ran past its bound of {seconds:g} s")
        if now >= next_pause[0]:  # a long run gives the GIL way to the engine's thread
            time.sleep(PAUSE)
            next_pause[0] = time.monotonic() + PAUSE_EVERY
        return check

    previous = sys.gettrace()
    sys.settrace(check)
    try:
        yield
    finally:
        sys.settrace(previous)
