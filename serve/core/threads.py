"""One intra-op thread budget for every worker of the server, not one per model.

Dividing the cores among one model's workers alone would oversubscribe a server of several models
(four one-worker models on two cores would run eight torch / ONNX Runtime / OpenMP threads), so
`budget_threads` divides the cores the server may use among every worker of every model; a
model's ``numThreads`` (``num_threads``) overrides its share and is taken off the top. The rule,
as a pure function:

* workers of models with an override get exactly that many threads each;
* the cores left (never below zero) are split evenly among all other workers, rounded down;
* every worker gets at least one thread, so with more workers than cores the sum exceeds the cores
  by construction (a worker cannot run on zero threads).

`ThreadBudget` applies it to a live server: a worker starts with its share (``OMP_NUM_THREADS``
and friends, ``torch.set_num_threads``, ONNX Runtime's ``intra_op_num_threads``), and when the set
of workers changes the running torch workers are told their new share (a THREADS frame; torch
applies it to the next operator). An ONNX Runtime session keeps the count it was created with
until its worker restarts; so does a BLAS library that read its environment at start.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ThreadDemand:
    """One model version's claim: ``workers`` workers, ``override`` threads each if set."""

    key: str
    workers: int
    override: int | None = None


def budget_threads(cores: int, demands: Sequence[ThreadDemand]) -> dict[str, int]:
    """Threads per worker for each demand's key (see the module docstring for the rule)."""
    fixed = sum(d.workers * d.override for d in demands if d.override)
    shared = sum(d.workers for d in demands if not d.override)
    left = max(cores - fixed, 0)
    per_worker = max(1, left // shared) if shared else 1
    return {d.key: d.override if d.override else per_worker for d in demands}


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask, as a container limits it)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


class BudgetedModel(Protocol):
    """What the budget reads of a model version (`serve.core.model.ModelVersion`)."""

    name: str
    version: str

    def thread_demand(self) -> ThreadDemand: ...

    def apply_threads(self, threads: int) -> None: ...


class ThreadBudget:
    """The server's budget over the model versions that ``models`` returns."""

    def __init__(
        self, models: Callable[[], Iterable[BudgetedModel]], cores: int | None = None
    ) -> None:
        self._models = models
        self.cores = cores or usable_cores()
        # The share each version was last told: `rebalance` tells only those whose share moved.
        self._told: dict[str, int] = {}

    def shares(self) -> dict[str, int]:
        return budget_threads(self.cores, [m.thread_demand() for m in self._models()])

    def threads_for(self, model: Any) -> int:
        """The share of one worker of ``model`` (which need not be registered yet)."""
        models = list(self._models())
        if model not in models:
            models.append(model)
        demands = [m.thread_demand() for m in models]
        return budget_threads(self.cores, demands)[model.thread_demand().key]

    def rebalance(self) -> None:
        """Tell each model version whose share moved its new share; it passes it on to its
        running workers. Linear in the versions: registering n models (n rebalances) tells each
        only when its share changes, not n times. A worker that starts later learns its share
        when it is ready (`serve.core.model.ModelVersion`), so nothing is lost by not repeating.
        """
        models = list(self._models())
        demands = [m.thread_demand() for m in models]
        shares = budget_threads(self.cores, demands)
        told = {}
        for model, demand in zip(models, demands, strict=True):
            share = shares[demand.key]
            told[demand.key] = share
            if self._told.get(demand.key) != share:
                model.apply_threads(share)
        self._told = told
