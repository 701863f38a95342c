"""``ts.utils.timeit_decorator``: print a function's wall and CPU time."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any


def timeit(func: Callable[..., Any]) -> Callable[..., Any]:
    """Print how long each call took (TorchServe's used ``time.clock``, gone since Python 3.8)."""

    @functools.wraps(func)
    def time_and_log(*args: Any, **kwargs: Any) -> Any:
        start, start_cpu = time.time(), time.process_time()
        result = func(*args, **kwargs)
        print(
            f"func: {func.__name__!r} took a total of {time.time() - start:2.4f} sec to run "
            f"and {time.process_time() - start_cpu:2.4f} sec of CPU time"
        )
        return result

    return time_and_log


__all__ = ["timeit"]
