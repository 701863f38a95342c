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


@dataclass(frozen=True, slots=True)
class ProcessMemory:
    """One process's memory in bytes, as the kernel counts it.

    ``rss`` counts every resident page it maps, shared library pages included, once per process;
    ``pss`` splits each page among the processes that map it (the workers' PSS adds up to what
    they hold together); ``uss`` counts the pages only it maps (``Private_Clean`` +
    ``Private_Dirty``: what the machine gets back when it exits). ``pss`` and ``uss`` are None
    where ``/proc/PID/smaps_rollup`` is missing (Linux before 4.14) or unreadable."""

    rss: int
    pss: int | None = None
    uss: int | None = None

    @property
    def unique_or_rss(self) -> int:
        """USS, or RSS where the kernel does not say (an overestimate, never an under-)."""
        return self.uss if self.uss is not None else self.rss

    @property
    def share_or_rss(self) -> int:
        """PSS, or RSS where the kernel does not say."""
        return self.pss if self.pss is not None else self.rss


_ROLLUP_FIELDS = {b"Rss": "rss", b"Pss": "pss", b"Private_Clean": "pc", b"Private_Dirty": "pd"}


def parse_smaps_rollup(text: bytes) -> ProcessMemory | None:
    """RSS, PSS and USS from the text of ``/proc/PID/smaps_rollup`` (values in kB); None when
    it lacks ``Rss`` or ``Pss``. USS is None unless both private fields are present."""
    found: dict[str, int] = {}
    for line in text.splitlines():
        key, sep, rest = line.partition(b":")
        name = _ROLLUP_FIELDS.get(key.strip()) if sep else None
        if name is None or name in found:
            continue  # e.g. the header line, Pss_Anon, Shared_*, Swap
        parts = rest.split()
        if not parts or not parts[0].isdigit() or (len(parts) > 1 and parts[1] != b"kB"):
            return None
        found[name] = int(parts[0]) * 1024
    if "rss" not in found or "pss" not in found:
        return None
    uss = found["pc"] + found["pd"] if "pc" in found and "pd" in found else None
    return ProcessMemory(found["rss"], found["pss"], uss)


def process_memory(pid: int | None) -> ProcessMemory | None:
    """RSS, PSS and USS of a process (PSS and USS None where smaps_rollup cannot be read), or
    None when it is gone."""
    if not pid:
        return None
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as fh:
            parsed = parse_smaps_rollup(fh.read())
        if parsed is not None:
            return parsed
    except OSError:
        pass  # missing (old kernel, no /proc) or not ours to read: RSS alone
    rss = process_rss(pid)
    return ProcessMemory(rss) if rss is not None else None


def process_unique(pid: int | None) -> int | None:
    """What a process adds to the machine: its USS, or its RSS where USS cannot be read."""
    memory = process_memory(pid)
    return memory.unique_or_rss if memory is not None else None


def process_rss(pid: int | None) -> int | None:
    """Resident set size of a process in bytes, or None when it is gone."""
    if not pid:
        return None
    try:
        with open(f"/proc/{pid}/statm", "rb") as fh:
            return int(fh.read().split()[1]) * _PAGE_SIZE
    except (OSError, ValueError, IndexError):
        return None


def child_pids(pid: int) -> list[int]:
    """Live processes whose parent is ``pid`` (a frontend's workers and spares); none without
    ``/proc``."""
    found = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for name in entries:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                stat = fh.read()
            if int(stat.rsplit(b")", 1)[1].split()[1]) == pid:
                found.append(int(name))
        except (OSError, ValueError, IndexError):
            continue
    return found
