"""Slot placement: a worker that runs many requests at once keeps taking them up to its budget.

For a worker whose handler or engine runs requests side by side (TorchServe's
``asyncCommunication: true``; a generative engine that schedules its running sequences step by
step), waiting for a free worker would leave it idle between requests. Instead each request goes
to the worker, as a batch of its own, as long as the worker runs fewer than its slot budget
(``batchSize``, or the engine's most running sequences); a request that ends frees its slot at
once, and the next waiting one takes it. A worker with all slots taken is BUSY.

Only the decision is new here: the queue, its deadlines, retries (none once an answer has begun
to stream) and errors are plain batching's (`serve.core.batching.BatchPlacement`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from serve.config import ModelSettings
from serve.core.batching import BatchPlacement
from serve.core.jobs import LIVE_STATES
from serve.core.placement import Plan, WorkerView


def plan_slots(waiting: int, free: Sequence[tuple[str, int]]) -> list[str]:
    """The worker each of the ``waiting`` oldest requests goes to now, oldest first.

    ``free`` is (worker id, free slots) per worker in service. Each request goes to the worker
    with the most free slots (the first of them on a tie), so that load spreads; requests beyond
    the free slots wait.
    """
    room = {worker: slots for worker, slots in free if slots > 0}
    targets: list[str] = []
    while room and len(targets) < waiting:
        worker = max(room, key=room.__getitem__)  # max keeps the first of equals
        targets.append(worker)
        room[worker] -= 1
        if room[worker] == 0:
            del room[worker]
    return targets


class SlotPlacement(BatchPlacement):
    """One FIFO; each request to the live worker with the most free slots (`plan_slots`).

    ``slots`` is the per-worker budget; None: the model's ``batch_size``. ``max_batch_delay``
    does not apply: a request never waits for others to fill a batch.
    """

    # The dispatcher cancels one request on such a worker (CANCEL) rather than kill the worker.
    cancels_requests = True

    def __init__(self, capacity: int, slots: int | None = None) -> None:
        super().__init__(capacity)
        self.slots = slots

    def learn(self, limits: Mapping[str, int]) -> None:
        """Take the budget a worker reported in LOADED (``slots``), when it reported one."""
        slots = limits.get("slots")
        if slots and slots > 0:
            self.slots = int(slots)

    def per_worker(self, settings: ModelSettings) -> int:
        return max(1, self.slots or settings.batch_size)

    def plan(self, workers: Sequence[WorkerView], now: float, settings: ModelSettings) -> Plan:
        budget = self.per_worker(settings)
        free = [(w.worker_id, budget - w.running) for w in workers if w.state in LIVE_STATES]
        plan = Plan()
        for worker_id in plan_slots(self.queue.live_count(), free):
            jobs = self.queue.take(1)
            if not jobs:
                break
            plan.batches.append((worker_id, jobs))
        return plan


def runs_many_at_once(model_config: Mapping[str, Any], handler: str | None) -> bool:
    """Whether a model's workers keep many requests in flight (`serve.worker.concurrent`):
    ``asyncCommunication: true``, or the built-in ``text_generation`` handler driving its engine
    (not in TorchServe's ``continuousBatching`` mode, one ``handle`` per step)."""
    if model_config.get("sequenceBatching"):
        return False
    if model_config.get("asyncCommunication"):
        return True
    name = (handler or "").split(":")[0]
    return name == "text_generation" and not model_config.get("continuousBatching")
