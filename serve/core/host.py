"""What the host says about memory, processes and GPUs: read by admission, describe and the pool,
and by the metrics collectors (``serve.metrics.system``) at scrape time."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class GpuSample:
    """One GPU as ``nvidia-smi`` reports it; a field it cannot report is None."""

    index: str
    uuid: str
    memory_used: float | None  # bytes
    memory_total: float | None  # bytes
    utilization: float | None  # percent


def read_meminfo() -> dict[str, int]:
    """MemTotal and MemAvailable in bytes (empty where /proc/meminfo is missing)."""
    found: dict[str, int] = {}
    try:
        with open("/proc/meminfo", "rb") as fh:
            for line in fh:
                key, _, rest = line.partition(b":")
                if key in (b"MemTotal", b"MemAvailable"):
                    found[key.decode()] = int(rest.split()[0]) * 1024
                    if len(found) == 2:
                        break
    except (OSError, ValueError, IndexError):
        return {}
    return found


_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def process_rss(pid: int | None) -> int | None:
    """Resident set size of a process in bytes, or None when it is gone."""
    if not pid:
        return None
    try:
        with open(f"/proc/{pid}/statm", "rb") as fh:
            return int(fh.read().split()[1]) * _PAGE_SIZE
    except (OSError, ValueError, IndexError):
        return None
