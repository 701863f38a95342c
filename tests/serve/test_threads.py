"""The server-wide thread budget: one table of cases for the pure rule, and the live budget with
fake model versions (each demand's share reaches its workers)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from serve.config import Config
from serve.core.model import ModelSource, ModelVersion
from serve.core.registry import Registry
from serve.core.threads import ThreadBudget, ThreadDemand, budget_threads
from tests.support.fake_workers import FakeWorkers

D = ThreadDemand

# cores, demands → threads per worker by key
CASES = [
    # one model: its workers share every core (what Lantern did before the budget)
    (2, [D("a", 1)], {"a": 2}),
    (2, [D("a", 2)], {"a": 1}),
    (16, [D("a", 3)], {"a": 5}),
    # several models share the cores, not each all of them
    (2, [D("a", 1), D("b", 1)], {"a": 1, "b": 1}),
    (8, [D("a", 1), D("b", 1), D("c", 2)], {"a": 2, "b": 2, "c": 2}),
    (16, [D("a", 2), D("b", 1), D("c", 1), D("d", 4)], {"a": 2, "b": 2, "c": 2, "d": 2}),
    # more workers than cores: one thread each, the least a worker can run on
    (2, [D("a", 1), D("b", 1), D("c", 1), D("d", 1)], {"a": 1, "b": 1, "c": 1, "d": 1}),
    # an override is taken off the top; the others share what is left
    (8, [D("a", 1, override=4), D("b", 2)], {"a": 4, "b": 2}),
    (8, [D("a", 2, override=4), D("b", 1)], {"a": 4, "b": 1}),
    # an override may exceed the cores; the others still get one thread each
    (2, [D("a", 1, override=6), D("b", 1)], {"a": 6, "b": 1}),
    # a model with no workers claims nothing
    (4, [D("a", 0), D("b", 1)], {"a": 4, "b": 4}),
    (4, [D("a", 0, override=3), D("b", 2)], {"a": 3, "b": 2}),
    (4, [], {}),
]


@pytest.mark.parametrize(("cores", "demands", "expected"), CASES)
def test_budget(cores: int, demands: list[ThreadDemand], expected: dict[str, int]) -> None:
    assert budget_threads(cores, demands) == expected


@pytest.mark.parametrize(("cores", "demands", "expected"), CASES)
def test_sum_is_within_the_cores_unless_overridden_or_too_many_workers(
    cores: int, demands: list[ThreadDemand], expected: dict[str, int]
) -> None:
    shares = budget_threads(cores, demands)
    total = sum(d.workers * shares[d.key] for d in demands)
    overridden = any(d.override and d.workers for d in demands)
    workers = sum(d.workers for d in demands)
    if not overridden and workers <= cores:
        assert total <= cores


class FakeModel:
    def __init__(self, key: str, workers: int, override: int | None = None) -> None:
        self.name, self.version = key, "1"
        self.key, self.workers, self.override = key, workers, override
        self.applied: list[int] = []

    def thread_demand(self) -> ThreadDemand:
        return ThreadDemand(self.key, self.workers, self.override)

    def apply_threads(self, threads: int) -> None:
        self.applied.append(threads)


def test_live_budget_counts_a_model_not_yet_registered_and_rebalances_everyone() -> None:
    models = [FakeModel("a", 1)]
    budget = ThreadBudget(lambda: models, cores=4)
    newcomer = FakeModel("b", 1)
    assert budget.threads_for(models[0]) == 4
    assert budget.threads_for(newcomer) == 2  # counted as if registered already
    models.append(newcomer)
    budget.rebalance()
    assert [m.applied for m in models] == [[2], [2]]
    models.pop()
    budget.rebalance()
    assert models[0].applied == [2, 4]


def test_registering_n_models_tells_each_its_share_a_bounded_number_of_times(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 40-node workflow registered 40 models and told every one its share after each: n**2
    `apply_threads` calls on the event loop. Now a version is told only when its share moves."""
    calls: list[str] = []
    real = ModelVersion.apply_threads

    def counting(self: ModelVersion, threads: int) -> None:
        calls.append(self.name)
        real(self, threads)

    monkeypatch.setattr(ModelVersion, "apply_threads", counting)
    registry = Registry(Config(memory_admission=False), tmp_path, worker_factory=FakeWorkers())
    registry.thread_budget.cores = 4
    manifest = {"model": {"modelName": "m", "handler": "echo_handler.py"}}
    n = 40

    async def register_all() -> None:
        try:
            for i in range(n):
                source = ModelSource(f"m{i}.mar", tmp_path, manifest, {}, None)
                await registry.add_source(f"m{i}", "1", source, initial_workers=1)
        finally:
            await registry.stop()

    asyncio.run(register_all())
    # Each worker is told once when it is ready; each version again only when its share moves
    # (4, 2, 1 on four cores: at most a few times), never once per later registration.
    assert len(calls) <= 3 * n, len(calls)
    assert max(calls.count(f"m{i}") for i in range(n)) <= 4
