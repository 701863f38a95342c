"""Slot placement: a worker that runs many requests at once keeps taking them up to its budget.

For a worker whose handler or engine runs requests side by side (TorchServe's
``asyncCommunication: true``; a generative engine that schedules its running sequences step by
step), waiting for a free worker would leave it idle between requests. Instead each request goes
to the worker, as a batch of its own, as long as the worker runs fewer than its slot budget
(``batchSize``, or the engine's most running sequences); a request that ends frees its slot at
once, and the next waiting one takes it. A worker with all slots taken is BUSY.

A generative engine also has a KV-cache budget (``max_cached_tokens`` in LOADED): a request
reserves prompt + max_tokens positions, capped by ``max_model_len``, as the engine reserves them.
The frontend cannot count prompt tokens (no tokenizer here, and a chat template adds tokens the
body does not show), so the worker reports each request's exact reservation in an ENGINE frame
as soon as it has read and tokenized it, even while a step runs
(`serve.wire.messages.EngineReport`). Until then a request counts as its fair share of the
budget, ``max_cached_tokens / slots``, or less when the worker's recent reservations were smaller
(`WorkerProcess.expected_reservation`). The fair share never blocks a burst that the worker can
take: N requests on an idle worker with N <= slots always go out at once, and one whose real
reservation is larger waits inside the engine for cache room (its ``waiting`` count), which
admits by the exact figures. Counting an unreported request at the most one could reserve,
``min(max_model_len, max_cached_tokens)``, as before, let a burst of 256 on a worker with 256
slots and 65,536 positions out 32 at a time (65,536 / 2,048): the rest overflowed the 100-deep
queue and were refused with 429 while the engine had room for all of them (GPU run 1, issue 40).
Requests beyond the budget by the reported figures wait in the dispatcher's queue (429 when it is
full), where any worker with room may take them.

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


def plan_slots(
    waiting: int,
    free: Sequence[tuple[str, int]],
    tokens: Mapping[str, int] | None = None,
    need: int | Mapping[str, int] = 0,
) -> list[str]:
    """The worker each of the ``waiting`` oldest requests goes to now, oldest first.

    ``free`` is (worker id, free slots) per worker in service. Each request goes to the worker
    with the most free slots (the first of them on a tie), so that load spreads; requests beyond
    the free slots wait. With ``tokens`` (worker id -> free KV-cache positions; a worker not in
    it has no token budget), each request also takes ``need`` positions (one figure, or one per
    worker), and a worker with fewer left takes no more.
    """
    room = {worker: slots for worker, slots in free if slots > 0}
    cache = dict(tokens or {})
    needs = need if isinstance(need, Mapping) else {worker: need for worker in room}
    targets: list[str] = []
    while len(targets) < waiting:
        fits = [w for w in room if w not in cache or cache[w] >= needs[w]]
        if not fits:
            break
        worker = max(fits, key=room.__getitem__)  # max keeps the first of equals
        targets.append(worker)
        room[worker] -= 1
        if worker in cache:
            cache[worker] -= needs[worker]
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

    def __init__(
        self, capacity: int, slots: int | None = None, max_cached_tokens: int | None = None
    ) -> None:
        super().__init__(capacity)
        self.slots = slots
        self.max_cached_tokens = max_cached_tokens  # per worker; None: no token budget
        self.max_model_len: int | None = None

    def learn(self, limits: Mapping[str, int]) -> None:
        """Take the budget a worker reported in LOADED: ``slots``, and an engine's
        ``max_cached_tokens`` and ``max_model_len``, when it reported them."""
        slots = limits.get("slots")
        if slots and slots > 0:
            self.slots = int(slots)
        cached = limits.get("max_cached_tokens")
        if cached and cached > 0:
            self.max_cached_tokens = int(cached)
        model_len = limits.get("max_model_len")
        if model_len and model_len > 0:
            self.max_model_len = int(model_len)

    def unreported_need(self, slots: int, expected: int | None = None) -> int:
        """What a request counts against a worker's cache budget until the worker reports it:
        its fair share of the budget over the worker's ``slots``, or ``expected`` (the worker's
        recent reservations) when that is less; at least 1."""
        budget = self.max_cached_tokens or 0
        fair = budget // max(1, slots)
        return max(1, min(expected, fair) if expected else fair)

    def per_worker(self, settings: ModelSettings) -> int:
        return max(1, self.slots or settings.batch_size)

    def plan(self, workers: Sequence[WorkerView], now: float, settings: ModelSettings) -> Plan:
        budget = self.per_worker(settings)
        live = [w for w in workers if w.state in LIVE_STATES]
        free = [(w.worker_id, budget - w.running) for w in live]
        tokens: dict[str, int] | None = None
        need = {w.worker_id: self.unreported_need(budget, w.expected_need) for w in live}
        if self.max_cached_tokens:
            tokens = {
                w.worker_id: self.max_cached_tokens
                - w.reserved_tokens
                - w.unreported * need[w.worker_id]
                for w in live
            }
        plan = Plan()
        for worker_id in plan_slots(self.queue.live_count(), free, tokens, need):
            jobs = self.queue.take(1)
            if not jobs:
                break
            plan.batches.append((worker_id, jobs))
        return plan


def is_engine_handler(handler: str | None) -> bool:
    """Whether ``handler`` is the built-in generative engine's (``text_generation[:fn]``)."""
    return (handler or "").split(":")[0] == "text_generation"


def runs_many_at_once(model_config: Mapping[str, Any], handler: str | None) -> bool:
    """Whether a model's workers keep many requests in flight (`serve.worker.concurrent`):
    ``asyncCommunication: true``, or the built-in ``text_generation`` handler driving its engine
    (not in TorchServe's ``continuousBatching`` mode, one ``handle`` per step)."""
    if model_config.get("sequenceBatching"):
        return False
    if model_config.get("asyncCommunication"):
        return True
    return is_engine_handler(handler) and not model_config.get("continuousBatching")
