"""Memory-aware admission: may N more workers of a model start, given what the host has free?

`decide` is the pure rule; `per_worker_need` picks the best evidence of what one worker needs
(a per-model setting, the measured USS of a running worker of the model, or an estimate from the
archive's size); `worker_charge` is what one running worker counts against
``worker_memory_limit_mb`` (its PSS); `host_headroom` reads what the host (and its cgroup, and
Lantern's own ``worker_memory_limit_mb``) leaves for new workers. The registry calls them before
it loads a model or adds workers and answers 507 (`InsufficientMemory`) instead of letting the
kernel's OOM killer decide.

Which measure, and why (docs/model-updates.md#memory-aware-admission): one more worker of a
model adds its *unique* pages (USS: ``Private_Clean`` + ``Private_Dirty``), because the shared
library pages torch maps are already resident for the workers (and spares) that map them; RSS
counts those pages again in every worker and would refuse workers that fit. What the workers
hold together is the sum of their PSS (each shared page split among the processes that map it,
so counted once). A lone worker's library pages are private to it, so its USS is close to its
RSS: the first measurement errs high, the safe side.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from serve.core.host import ProcessMemory, read_meminfo

MIB = 1 << 20
# A Python worker with our worker loop and nothing else, before the handler imports anything.
WORKER_BASE_BYTES = 64 * MIB
# Weights are read, then unpacked into tensors: count the model files twice.
ARCHIVE_FACTOR = 2


@dataclass(frozen=True)
class Need:
    """What one worker is expected to take, and on what evidence."""

    per_worker: int
    source: str  # "configured", "measured" or "estimated"


@dataclass(frozen=True)
class Headroom:
    """Bytes new workers may take, and what bounds it."""

    available: int
    bound: str  # e.g. "host MemAvailable", "cgroup memory.max", "worker_memory_limit_mb"


@dataclass(frozen=True)
class Decision:
    admitted: bool
    message: str = ""


def per_worker_need(configured_mb: int | None, measured: Iterable[int], archive_bytes: int) -> Need:
    """The configured figure wins; else the largest of ``measured`` (running workers' USS, or RSS
    where unreadable); else the estimate."""
    if configured_mb:
        return Need(configured_mb * MIB, "configured")
    sizes = [m for m in measured if m > 0]
    if sizes:
        return Need(max(sizes), "measured")
    return Need(WORKER_BASE_BYTES + ARCHIVE_FACTOR * archive_bytes, "estimated")


def worker_charge(memory: ProcessMemory | None, loaded: bool, retiring: bool, promised: int) -> int:
    """Bytes one worker counts against the workers' total: a loaded worker its PSS (RSS where
    PSS is unreadable); one still starting (or unreadable) at least what it was admitted with,
    unless it is retiring; a retiring one only what it holds."""
    held = memory.share_or_rss if memory is not None else 0
    if held and loaded:
        return held
    if retiring:
        return held
    return max(held, promised)


def decide(what: str, workers: int, need: Need, headroom: Headroom, reserve: int) -> Decision:
    """Admit ``workers`` new workers of ``what`` when they fit in ``headroom`` less ``reserve``."""
    if workers <= 0:
        return Decision(True)
    total = workers * need.per_worker
    free = headroom.available - reserve
    if total <= free:
        return Decision(True)
    plural = "worker" if workers == 1 else "workers"
    return Decision(
        False,
        f"Not enough memory to start {workers} {plural} for {what}: they need about "
        f"{_size(total)} ({_size(need.per_worker)} each, {need.source}), and "
        f"{_size(max(free, 0))} is free ({_size(headroom.available)} by {headroom.bound}, less a "
        f"reserve of {_size(reserve)}). Free memory, start fewer workers, or adjust "
        "memory_reserve_mb, worker_memory_limit_mb or the model's memoryPerWorkerMB "
        "(gpuMemoryPerWorkerMB on a GPU).",
    )


def gpu_placements(workers: int, device_ids: list[int]) -> dict[int, int]:
    """New workers per GPU, conservatively: each device may get ``ceil(workers / devices)``
    (the pool assigns them round-robin from wherever its last worker went)."""
    if workers <= 0 or not device_ids:
        return {}
    per_device = -(-workers // len(device_ids))
    return {device: min(per_device, workers) for device in sorted(set(device_ids))}


def decide_gpus(
    what: str,
    placements: dict[int, int],
    need: Need,
    free_by_device: dict[int, int],
    reserve: int,
) -> Decision:
    """`decide` on each GPU that gets new workers; a device with no sample is not checked."""
    for device, count in sorted(placements.items()):
        free = free_by_device.get(device)
        if free is None:
            continue
        bound = f"free memory of GPU {device} (nvidia-smi)"
        decision = decide(f"{what} on GPU {device}", count, need, Headroom(free, bound), reserve)
        if not decision.admitted:
            return decision
    return Decision(True)


def visible_free(free_by_index: dict[int, int], cuda_visible: str | None) -> dict[int, int]:
    """nvidia-smi's per-GPU free bytes (physical indices) by the ids workers use (indices into
    ``CUDA_VISIBLE_DEVICES`` when it is set). Devices named by UUID are not matched: unchecked."""
    if cuda_visible is None:
        return dict(free_by_index)
    out = {}
    for visible, physical in enumerate(p.strip() for p in cuda_visible.split(",") if p.strip()):
        if physical.isdigit() and int(physical) in free_by_index:
            out[visible] = free_by_index[int(physical)]
    return out


def host_headroom(
    workers_rss: int, limit_mb: int = 0, *, cgroup: Path = Path("/sys/fs/cgroup")
) -> Headroom:
    """The least of: the host's MemAvailable, the cgroup's limit less its usage, and
    ``limit_mb`` (the most all workers together may use) less what they use (``workers_rss``:
    the sum of `worker_charge`, PSS-based)."""
    options: list[Headroom] = []
    available = read_meminfo().get("MemAvailable")
    if available is not None:
        options.append(Headroom(available, "host MemAvailable"))
    limited = _cgroup_headroom(cgroup)
    if limited is not None:
        options.append(Headroom(limited, "cgroup memory.max"))
    if limit_mb > 0:
        options.append(Headroom(limit_mb * MIB - workers_rss, "worker_memory_limit_mb"))
    if not options:
        return Headroom(1 << 62, "nothing (no /proc/meminfo)")
    return min(options, key=lambda h: h.available)


def _cgroup_headroom(root: Path) -> int | None:
    try:
        limit = (root / "memory.max").read_text().strip()
        if limit == "max":
            return None
        return int(limit) - int((root / "memory.current").read_text().strip())
    except (OSError, ValueError):
        return None


def tree_size(path: Path) -> int:
    """Bytes of every file under ``path`` (the extracted archive)."""
    total = 0
    for entry in path.rglob("*"):
        try:
            if entry.is_file() and not entry.is_symlink():
                total += entry.stat().st_size
        except OSError:
            continue
    return total


def _size(n: int) -> str:
    if abs(n) >= 1 << 30:
        return f"{n / (1 << 30):.1f} GiB"
    return f"{n / MIB:.0f} MiB"
