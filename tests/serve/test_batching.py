"""The batching rule, as pure logic."""

from __future__ import annotations

from serve.core.batching import plan_batches


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
