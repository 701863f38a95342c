"""The batching rules, as pure logic."""

from __future__ import annotations

import asyncio

import pytest

from serve.core.batching import plan_batches, split_retries
from serve.core.jobs import BatchItem, ItemResult, Job


def test_nothing_to_do() -> None:
    assert plan_batches(0, 2, 0, 8, 0.0, 0.1) == ([], 0.0)
    assert plan_batches(5, 0, 2, 8, 0.0, 0.1) == ([], 0.0)


def test_lone_request_on_idle_model_goes_at_once() -> None:
    assert plan_batches(1, 1, 0, 8, 0.0, 0.1) == ([1], 0.0)


def test_partial_batch_waits_while_other_workers_are_busy() -> None:
    sizes, wait = plan_batches(3, 1, 1, 8, 0.02, 0.1)
    assert sizes == [] and abs(wait - 0.08) < 1e-9


def test_partial_batch_goes_once_the_oldest_has_waited_the_delay() -> None:
    assert plan_batches(3, 1, 1, 8, 0.1, 0.1) == ([3], 0.0)


def test_full_batch_goes_at_once_even_with_busy_workers() -> None:
    assert plan_batches(20, 1, 1, 8, 0.0, 0.1) == ([8], 0.0)


def test_work_is_spread_over_free_workers() -> None:
    assert plan_batches(8, 2, 0, 8, 0.0, 0.1) == ([4, 4], 0.0)
    assert plan_batches(3, 2, 0, 8, 0.0, 0.1) == ([2, 1], 0.0)
    assert plan_batches(40, 2, 0, 8, 0.0, 0.1) == ([8, 8], 0.0)
    assert plan_batches(1, 4, 0, 8, 0.0, 0.1) == ([1], 0.0)


@pytest.mark.parametrize(
    ("retries", "answered", "deadline", "allowed", "retried"),
    [
        (0, False, 10.0, True, True),  # a first death beside a live worker: one more try
        (1, False, 10.0, True, False),  # tried once already
        (0, True, 10.0, True, False),  # answered (expired, or a stream has begun)
        (0, False, 5.0, True, False),  # past its deadline
        (0, False, 10.0, False, False),  # no other live worker, or unloading
    ],
)
def test_a_dead_workers_jobs_get_one_more_try_only_while_they_can_use_it(
    retries: int, answered: bool, deadline: float, allowed: bool, retried: bool
) -> None:
    async def scenario() -> None:
        future: asyncio.Future[ItemResult] = asyncio.get_running_loop().create_future()
        if answered:
            future.set_result(ItemResult(200, b"", None))
        job = Job(BatchItem("r", {}, []), future, 0.0, deadline, retries=retries)
        again, failed = split_retries([job], 5.0, allowed)
        assert (again, failed) == (([job], []) if retried else ([], [job]))

    asyncio.run(scenario())
