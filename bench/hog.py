"""Background CPU hogs for the "loaded machine" rows of the benchmarks (stopped by their pid)."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator


@contextlib.contextmanager
def cpu_hogs(count: int) -> Iterator[list[int]]:
    """``count`` processes spinning ``while 1: pass``; killed (by pid) on the way out."""
    procs = [
        subprocess.Popen([sys.executable, "-c", "while 1: pass"], stdin=subprocess.DEVNULL)
        for _ in range(count)
    ]
    try:
        yield [p.pid for p in procs]
    finally:
        for proc in procs:
            proc.kill()
        for proc in procs:
            proc.wait()
