"""The seam between the one dispatcher and its placement policies: what a policy sees and says.

A policy owns a model version's waiting jobs and decides which worker runs which of them; the
dispatcher (`serve.core.dispatcher`) owns everything else: deadlines, batch tasks, time limits,
worker states, draining. Each policy's decision is a pure function over (waiting jobs, worker
views, now) that is table-tested on its own:

* `serve.core.batching.BatchPlacement`: dynamic batching over one FIFO (`plan_batches`);
* `serve.core.continuous.ContinuousPlacement`: continuous batching, one step per batch, that
  carries unfinished requests into their worker's next step and lets new ones join it
  (`plan_continuous`);
* `serve.core.sequences.SequencePlacement`: sequence affinity for stateful models, and its
  continuous variant that carries unfinished requests into the worker's next batch
  (`plan_sequence_batches`);
* `serve.core.slots.SlotPlacement`: a worker that runs many requests at once (an async or
  generative worker) keeps taking requests up to its slot budget (`plan_slots`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from serve.config import ModelSettings
from serve.core.jobs import ItemResult, Job, WorkerState
from serve.wire.errors import ServeError


@dataclass(frozen=True, slots=True)
class WorkerView:
    """What a policy knows of one worker in service."""

    worker_id: str
    state: WorkerState
    running: int = 0  # jobs the dispatcher has on it now
    # A generative engine's KV-cache budget in use (slot placement): cache positions reserved by
    # its jobs whose reservation it reported, and how many of its jobs have not reported one yet.
    reserved_tokens: int = 0
    unreported: int = 0
    expected_need: int | None = None  # what its unreported jobs are counted at, once it knows


@dataclass(slots=True)
class Plan:
    """A policy's answer: the batches to send now, and when to look again if none."""

    batches: list[tuple[str, list[Job]]] = field(default_factory=list)  # (worker id, its jobs)
    wait: float = 0.0  # > 0: nothing goes now; ask again after this many seconds


Answer = ItemResult | ServeError


class Placement(Protocol):
    """A placement policy: the waiting jobs of one model version and where they go.

    The dispatcher calls it with no ``await`` inside any method, so a method sees the state its
    previous call left; nothing passes between calls but the arguments.
    """

    capacity: int  # the most jobs it holds waiting (describe and admission read it)

    def __len__(self) -> int:
        """Jobs held waiting, answered ones not yet dropped included."""
        ...

    def live_count(self) -> int:
        """Jobs waiting and not yet answered."""
        ...

    def per_worker(self, settings: ModelSettings) -> int | None:
        """Jobs one worker may run at once over all its batches; None: one batch at a time.

        A worker is BUSY (offered nothing) while it runs that many, READY otherwise.
        """
        ...

    def admit(self, job: Job) -> None:
        """Hold a new job; raises a `ServeError` (429, 400, ...) when it cannot wait here."""
        ...

    def plan(self, workers: Sequence[WorkerView], now: float, settings: ModelSettings) -> Plan:
        """Take the jobs that go now, and say to which worker (by id) each batch goes."""
        ...

    def put_back(self, worker_id: str, jobs: list[Job]) -> None:
        """A planned batch was never sent (its worker left first)."""
        ...

    def settle(self, worker_id: str, jobs: list[Job], answers: Sequence[Answer]) -> None:
        """A batch came back, one answer per job: answer the jobs (or keep them for a next step)."""
        ...

    def lost(self, worker_id: str, jobs: list[Job], *, retry: bool) -> None:
        """The worker died running ``jobs``; ``retry``: another live worker could run them."""
        ...

    def fail_waiting(self, error: ServeError) -> None:
        """Answer every job that waits (not the running ones) with ``error``."""
        ...

    async def drain_carried(self, timeout: float) -> None:
        """Let requests that go on across batches end, for at most ``timeout`` seconds; then
        carry none further. Returns at once for a policy that carries nothing."""
        ...
