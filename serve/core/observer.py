"""What the core reports as it serves, and the one reading it asks for: the core's metrics seam.

The core (`Registry`, `ModelVersion`) calls an `Observer`; the server passes its
``serve.metrics.prometheus.ServerMetrics``, tests may pass their own. The core never imports the
metrics package: the scrape-time collectors there read the registry instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from serve.core.host import GpuSample
    from serve.core.jobs import BatchOutcome, Job


class Observer(Protocol):
    """The events a model version reports, and the GPU readings memory admission needs."""

    def batch_done(self, model: str, version: str, jobs: list[Job], outcome: BatchOutcome) -> None:
        """A worker answered ``jobs``: batch size, queue waits, handler phases and metrics."""

    def worker_restarted(self, model: str, version: str) -> None:
        """A worker process exited unasked and was started again."""

    def worker_recycled(self, model: str, version: str, reason: str) -> None:
        """A healthy worker was replaced on purpose (``reason``: ``memory``, its RSS cap)."""

    def model_removed(self, model: str) -> None:
        """The last version of ``model`` is gone: forget every series labelled with it."""

    async def gpu_samples(self) -> list[GpuSample]:
        """The latest GPU readings (shared with the scrapes); empty where there are none."""


@dataclass
class VersionTally:
    """Per model version, what Triton's statistics extension reports: requests that succeeded
    and failed with their cumulative seconds, and batches run with the requests in them."""

    success: int = 0
    success_seconds: float = 0.0
    fail: int = 0
    fail_seconds: float = 0.0
    queue_seconds: float = 0.0
    executions: int = 0  # batches a worker ran
    inferences: int = 0  # requests in them
    last_inference: float = 0.0  # time.time() of the last answered request, 0 if none
