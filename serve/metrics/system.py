"""Host and GPU gauges read at scrape time: CPU and memory from /proc, GPUs from ``nvidia-smi``.

The frontend never imports torch, so GPU numbers come from ``nvidia-smi --query-gpu`` (only when
it is on PATH), run without blocking the event loop and cached for a second or two.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import time
from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from serve.core.host import GpuSample, read_meminfo

logger = logging.getLogger(__name__)

_GPU_QUERY = "index,uuid,memory.used,memory.total,utilization.gpu"
_GPU_TTL = 2.0  # seconds a GPU sample is reused; nvidia-smi itself takes tens of ms
_GPU_RETRY = 60.0  # seconds before trying again after nvidia-smi failed
_GPU_TIMEOUT = 5.0
_MIB = 1 << 20


def parse_nvidia_smi(text: str) -> list[GpuSample]:
    """Rows of ``nvidia-smi --query-gpu=index,uuid,memory.used,memory.total,utilization.gpu
    --format=csv,noheader,nounits``; fields it cannot report (``[N/A]``) become None."""
    samples = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 5 or not parts[0]:
            continue
        used, total, util = (_number(p) for p in parts[2:])
        samples.append(
            GpuSample(
                parts[0],
                parts[1],
                used * _MIB if used is not None else None,
                total * _MIB if total is not None else None,
                util,
            )
        )
    return samples


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def read_cpu_times() -> tuple[int, int] | None:
    """(busy, total) jiffies over all CPUs since boot, from the first line of /proc/stat."""
    try:
        with open("/proc/stat", "rb") as fh:
            fields = fh.readline().split()[1:9]
    except OSError:
        return None
    if len(fields) < 5:
        return None
    values = [int(v) for v in fields]
    idle = values[3] + values[4]  # idle + iowait
    total = sum(values)
    return total - idle, total


class SystemMetrics:
    """A prometheus collector of host CPU and memory, and of GPUs when ``nvidia-smi`` exists."""

    def __init__(self, nvidia_smi: str | None = None, *, find_nvidia_smi: bool = True) -> None:
        self.nvidia_smi = nvidia_smi or (shutil.which("nvidia-smi") if find_nvidia_smi else None)
        self._cpu_last = read_cpu_times()
        self._cpu_percent = 0.0
        self._gpus: list[GpuSample] = []
        self._gpu_next = 0.0  # monotonic time of the next allowed nvidia-smi run
        self._gpu_task: asyncio.Task[None] | None = None

    def describe(self) -> list[Metric]:
        return []  # the families depend on the host; never collected at registration

    async def refresh(self) -> None:
        """Sample the GPUs if the cached sample is stale; concurrent scrapes share one run."""
        if self.nvidia_smi is None or time.monotonic() < self._gpu_next:
            return
        if self._gpu_task is None or self._gpu_task.done():
            self._gpu_task = asyncio.create_task(self._sample_gpus(self.nvidia_smi))
        await asyncio.shield(self._gpu_task)

    async def _sample_gpus(self, exe: str) -> None:
        try:
            proc = await asyncio.create_subprocess_exec(
                exe,
                f"--query-gpu={_GPU_QUERY}",
                "--format=csv,noheader,nounits",
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            try:
                out, err = await asyncio.wait_for(proc.communicate(), _GPU_TIMEOUT)
            except asyncio.TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
                raise OSError(f"timed out after {_GPU_TIMEOUT:g} s") from None
            if proc.returncode != 0:
                raise OSError(err.decode(errors="replace").strip() or f"exit {proc.returncode}")
        except OSError as exc:
            if self._gpus or self._gpu_next == 0.0:  # say it once per failure streak
                logger.warning("GPU metrics unavailable: %s failed: %s", exe, exc)
            self._gpus = []
            self._gpu_next = time.monotonic() + _GPU_RETRY
            return
        self._gpus = parse_nvidia_smi(out.decode(errors="replace"))
        self._gpu_next = time.monotonic() + _GPU_TTL

    async def gpu_samples(self) -> list[GpuSample]:
        """The latest GPU samples (refreshed if stale); empty without nvidia-smi."""
        await self.refresh()
        return list(self._gpus)

    def cpu_percent(self) -> float:
        """Host CPU use since the previous call (since start on the first one)."""
        now = read_cpu_times()
        last = self._cpu_last
        if now is not None and last is not None:
            busy, total = now[0] - last[0], now[1] - last[1]
            if total > 0:
                self._cpu_percent = 100.0 * busy / total
                self._cpu_last = now
        elif now is not None:
            self._cpu_last = now
        return self._cpu_percent

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(
            "serve_host_cpu_utilization_percent",
            "Host CPU use over all cores since the previous scrape.",
            value=self.cpu_percent(),
        )
        mem = read_meminfo()
        if "MemTotal" in mem and "MemAvailable" in mem:
            total, available = mem["MemTotal"], mem["MemAvailable"]
            yield GaugeMetricFamily("serve_host_memory_total_bytes", "Host memory.", value=total)
            yield GaugeMetricFamily(
                "serve_host_memory_available_bytes",
                "Host memory available to new processes.",
                value=available,
            )
            yield GaugeMetricFamily(
                "serve_host_memory_used_bytes", "Host memory in use.", value=total - available
            )
        if not self._gpus:
            return
        labels = ["device", "uuid"]
        used = GaugeMetricFamily("serve_gpu_memory_used_bytes", "GPU memory in use.", labels=labels)
        total_ = GaugeMetricFamily("serve_gpu_memory_total_bytes", "GPU memory.", labels=labels)
        util = GaugeMetricFamily(
            "serve_gpu_utilization_percent",
            "Time a kernel ran on the GPU over nvidia-smi's sample period.",
            labels=labels,
        )
        for gpu in self._gpus:
            key = [gpu.index, gpu.uuid]
            if gpu.memory_used is not None:
                used.add_metric(key, gpu.memory_used)
            if gpu.memory_total is not None:
                total_.add_metric(key, gpu.memory_total)
            if gpu.utilization is not None:
                util.add_metric(key, gpu.utilization)
        yield from (used, total_, util)
