"""The dispatcher driven in process by fake workers: deterministic cases, then properties."""

from __future__ import annotations

import ast
import asyncio
import itertools
from collections import Counter
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import serve
from serve.config import ModelSettings
from serve.core.dispatcher import Dispatcher
from serve.core.jobs import BatchItem, BatchOutcome, ItemResult, WorkerState, next_state
from serve.wire.errors import GatewayTimeout, NoHealthyWorkers, ServeError, ShuttingDown, WorkerDied
from tests.serve.fake_workers import FakePool
from tests.support.waiting import until

_ids = itertools.count()


def item() -> BatchItem:
    return BatchItem(f"r{next(_ids)}", {}, [("body", None, b"")])


def make(
    workers: int, **overrides: object
) -> tuple[Dispatcher, FakePool, Callable[[], ModelSettings]]:
    values: dict[str, object] = {
        "batch_size": 4,
        "max_batch_delay": 0,
        "response_timeout": 60.0,
        "job_queue_size": 10_000,
    }
    values.update(overrides)
    model_settings = ModelSettings().merged(values)
    pool = FakePool(workers)
    dispatcher = Dispatcher("m", "1", pool, lambda: model_settings)
    return dispatcher, pool, lambda: model_settings


async def ticks(n: int = 5) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


def run(test: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(test())


def outcome(future: asyncio.Future[ItemResult]) -> ItemResult | BaseException:
    assert future.done()
    return future.exception() or future.result()


# ----- deterministic cases ---------------------------------------------------------------------


def test_a_lone_job_runs_on_a_free_worker_and_is_answered() -> None:
    async def scenario() -> None:
        dispatcher, pool, _ = make(1)
        job = item()
        future = dispatcher.submit(job)
        worker = pool.workers_[0]
        await until(lambda: worker.holding)
        assert worker.state is WorkerState.BUSY and worker.sent == [[job.request_id]]
        worker.finish()
        result = await future
        assert result.body == job.request_id.encode()
        assert worker.state is WorkerState.READY and dispatcher.in_flight == 0

    run(scenario)


def test_jobs_on_a_worker_that_dies_run_once_more_on_a_live_worker() -> None:
    async def scenario() -> None:
        dispatcher, pool, _ = make(2, batch_size=2)
        futures = [dispatcher.submit(item()) for _ in range(4)]
        victim, survivor = pool.workers_
        await until(lambda: victim.holding and survivor.holding)
        victim.die()
        survivor.finish()
        await until(lambda: survivor.holding)  # the victim's jobs, retried
        assert survivor.sent[1] == victim.sent[0]
        survivor.finish()
        results = await asyncio.gather(*futures)
        assert all(r.status == 200 for r in results)

    run(scenario)


def test_a_job_whose_only_worker_dies_fails_without_retry() -> None:
    async def scenario() -> None:
        dispatcher, pool, _ = make(1)
        future = dispatcher.submit(item())
        (worker,) = pool.workers_
        await until(lambda: worker.holding)
        worker.die()
        with pytest.raises(WorkerDied):
            await future
        assert len(worker.sent) == 1

    run(scenario)


def test_a_retried_job_that_loses_its_second_worker_too_fails() -> None:
    async def scenario() -> None:
        dispatcher, pool, _ = make(3, batch_size=1)
        future = dispatcher.submit(item())
        await until(lambda: any(w.holding for w in pool.workers_))
        first = next(w for w in pool.workers_ if w.holding)
        first.die()
        await until(lambda: any(w.holding for w in pool.workers_ if w is not first))
        second = next(w for w in pool.workers_ if w.holding)
        second.die()
        with pytest.raises(WorkerDied):
            await future
        assert sum(len(w.sent) for w in pool.workers_) == 2

    run(scenario)


def test_a_worker_dead_between_dispatch_and_send_gets_nothing_and_costs_no_retry() -> None:
    async def scenario() -> None:
        dispatcher, pool, _ = make(2, batch_size=1)
        a, b = pool.workers_
        b.state = WorkerState.STARTING  # only `a` is free
        future = dispatcher.submit(item())
        # Runs after the dispatch (which hands `a` the job) and before the batch task sends it.
        asyncio.get_running_loop().call_soon(a.die)
        await ticks()
        assert a.sent == [] and a.violations == []
        b.state = WorkerState.READY
        dispatcher.schedule()
        await until(lambda: b.holding)
        b.die()  # a first real death: the job still has its one retry
        c = pool.replace(1)
        dispatcher.schedule()
        await ticks()
        assert not future.done()  # `c` is the only live worker, but the retry is still owed
        await until(lambda: c.holding)
        c.finish()
        assert (await future).status == 200

    run(scenario)


def test_a_job_past_its_deadline_in_the_queue_gets_504() -> None:
    async def scenario() -> None:
        dispatcher, pool, _ = make(1)
        pool.workers_[0].state = WorkerState.STARTING  # nobody free: the job waits
        future = dispatcher.submit(item(), timeout=0.05)
        with pytest.raises(GatewayTimeout):
            await asyncio.wait_for(future, 5)
        assert pool.workers_[0].sent == []

    run(scenario)


def test_a_batch_past_the_hard_limit_kills_its_worker_and_gets_504_without_retry() -> None:
    async def scenario() -> None:
        dispatcher, pool, _ = make(2, response_timeout=60, hard_timeout=0.05, batch_size=1)
        future = dispatcher.submit(item())
        with pytest.raises(GatewayTimeout):
            await asyncio.wait_for(future, 5)
        stuck = [w for w in pool.workers_ if w.sent]
        assert len(stuck) == 1 and stuck[0].killed
        assert sum(len(w.sent) for w in pool.workers_) == 1

    run(scenario)


def test_no_worker_at_all_is_refused_at_once() -> None:
    async def scenario() -> None:
        dispatcher, pool, _ = make(0)
        with pytest.raises(NoHealthyWorkers):
            dispatcher.submit(item())

    run(scenario)


def test_queued_jobs_fail_at_once_when_the_pool_can_no_longer_serve() -> None:
    async def scenario() -> None:
        dispatcher, pool, _ = make(1)
        pool.workers_[0].state = WorkerState.STARTING
        future = dispatcher.submit(item())
        await ticks()
        pool.serving = False  # its only slot gave up
        dispatcher.schedule()
        with pytest.raises(NoHealthyWorkers):
            await asyncio.wait_for(future, 5)

    run(scenario)


def test_drain_refuses_new_work_finishes_running_work_then_fails_the_rest() -> None:
    async def scenario() -> None:
        dispatcher, pool, _ = make(1, batch_size=1)
        (worker,) = pool.workers_
        first, second, third = (dispatcher.submit(item()) for _ in range(3))
        await until(lambda: worker.holding)
        drain = asyncio.create_task(dispatcher.drain(timeout=0.2))
        await ticks()
        with pytest.raises(ShuttingDown):
            dispatcher.submit(item())
        worker.finish()
        assert (await first).status == 200
        await until(lambda: worker.holding)  # queued work still runs while draining...
        await asyncio.wait_for(drain, 5)  # ...until the drain's time is up
        with pytest.raises(ShuttingDown):
            await third  # still queued then: answered, not left hanging
        assert not second.done()  # running: the unload's stop ends it
        worker.die()
        with pytest.raises(WorkerDied):
            await second  # no retry while unloading

    run(scenario)


def test_drain_waits_for_in_flight_work_when_it_finishes_in_time() -> None:
    async def scenario() -> None:
        dispatcher, pool, _ = make(1, batch_size=1)
        (worker,) = pool.workers_
        futures = [dispatcher.submit(item()) for _ in range(3)]
        drain = asyncio.create_task(dispatcher.drain(timeout=30))
        for _ in futures:
            await until(lambda: worker.holding)
            worker.finish()
        await asyncio.wait_for(drain, 5)
        assert [outcome(f).status for f in futures] == [200, 200, 200]  # type: ignore[union-attr]

    run(scenario)


# ----- properties ------------------------------------------------------------------------------

# One step of a scenario: submit some jobs, let a worker answer, kill one, restart a dead one, or
# let the event loop run.
_step = st.one_of(
    st.tuples(st.just("submit"), st.integers(1, 6)),
    st.tuples(st.just("finish"), st.integers(0, 3)),
    st.tuples(st.just("die"), st.integers(0, 3)),
    st.tuples(st.just("die_soon"), st.integers(0, 3)),  # dies between dispatch and send
    st.tuples(st.just("restart"), st.integers(0, 3)),
    st.tuples(st.just("tick"), st.just(0)),
)


async def _play(
    steps: list[tuple[str, int]], workers: int, batch_size: int, immortal: int | None
) -> tuple[FakePool, list[asyncio.Future[ItemResult]], list[str]]:
    dispatcher, pool, _ = make(workers, batch_size=batch_size)
    futures: list[asyncio.Future[ItemResult]] = []
    ids: list[str] = []
    for op, arg in steps:
        index = arg % workers
        worker = pool.workers_[index]
        if op in ("submit", "die_soon"):
            for _ in range(arg if op == "submit" else 1):
                job = item()
                ids.append(job.request_id)
                futures.append(dispatcher.submit(job))
            if op == "die_soon" and index != immortal:
                asyncio.get_running_loop().call_soon(worker.die)
        elif op == "finish":
            worker.finish()
        elif op == "die" and index != immortal:
            worker.die()
        elif op == "restart" and worker.state is WorkerState.DEAD:
            pool.replace(index)
            dispatcher.schedule()
        await ticks(3)
    # Bring everyone back and let the workers answer until every request is done.
    for index, worker in enumerate(list(pool.workers_)):
        if worker.state is WorkerState.DEAD:
            pool.replace(index)
    dispatcher.schedule()

    def all_done() -> bool:  # else let the workers answer what they hold
        if all(f.done() for f in futures):
            return True
        for worker in pool.workers_:
            worker.finish()
        return False

    await until(all_done, 10)
    return pool, futures, ids


def _check(pool: FakePool, futures: list[asyncio.Future[ItemResult]], ids: list[str]) -> None:
    everyone = pool.everyone()
    # None sent to a dead (or not dispatched) worker, none sent to a worker twice at once.
    assert [v for w in everyone for v in w.violations] == []
    sends = Counter(rid for w in everyone for batch in w.sent for rid in batch)
    completions = Counter(rid for w in everyone for rid in w.completed)
    for rid, future in zip(ids, futures, strict=True):
        result = outcome(future)
        assert completions[rid] <= 1, f"{rid} ran to completion twice"
        assert sends[rid] <= 2, f"{rid} was sent {sends[rid]} times (one retry at most)"
        if isinstance(result, ItemResult):
            assert completions[rid] == 1 and result.body == rid.encode()
        else:
            assert isinstance(result, WorkerDied), result
            assert completions[rid] == 0 and sends[rid] >= 1


_SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@_SETTINGS
@given(
    steps=st.lists(_step, max_size=40),
    workers=st.integers(1, 4),
    batch_size=st.integers(1, 4),
)
def test_no_job_is_lost_run_twice_or_sent_to_a_dead_worker(
    steps: list[tuple[str, int]], workers: int, batch_size: int
) -> None:
    pool, futures, ids = asyncio.run(_play(steps, workers, batch_size, immortal=None))
    _check(pool, futures, ids)


@_SETTINGS
@given(
    steps=st.lists(_step, max_size=40),
    workers=st.integers(2, 4),
    batch_size=st.integers(1, 4),
)
def test_one_death_at_a_time_beside_a_live_worker_fails_no_request(
    steps: list[tuple[str, int]], workers: int, batch_size: int
) -> None:
    """Worker 0 never dies and deaths are restarted before the next: every request succeeds."""
    one_at_a_time: list[tuple[str, int]] = []
    for op, arg in steps:
        one_at_a_time.append((op, arg))
        if op in ("die", "die_soon"):
            one_at_a_time.append(("restart", arg))
    pool, futures, ids = asyncio.run(_play(one_at_a_time, workers, batch_size, immortal=0))
    _check(pool, futures, ids)
    failed = [rid for rid, f in zip(ids, futures, strict=True) if f.exception() is not None]
    twice_hit = {
        rid for rid in failed if sum(rid in batch for w in pool.everyone() for batch in w.sent) == 2
    }
    assert set(failed) == twice_hit, "a request failed after a single worker death"


def test_errors_from_a_live_worker_reach_only_their_own_request() -> None:
    async def scenario() -> None:
        dispatcher, pool, _ = make(1, batch_size=2)
        (worker,) = pool.workers_
        good, bad = item(), item()
        futures = [dispatcher.submit(good), dispatcher.submit(bad)]
        await until(lambda: worker.holding)
        assert worker._current is not None
        worker._current.set_result(
            BatchOutcome(
                [ItemResult(200, b"ok", None), ServeError("boom")],
                {},
                [],
            )
        )
        assert (await futures[0]).body == b"ok"
        with pytest.raises(ServeError) as failed:
            await futures[1]
        assert f"request id {bad.request_id}" in failed.value.message

    run(scenario)


def test_an_unexpected_error_running_a_batch_answers_it_500_and_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def scenario() -> None:
        dispatcher, pool, _ = make(1)
        (worker,) = pool.workers_
        future = dispatcher.submit(item())
        await until(lambda: worker.holding)
        assert worker._current is not None
        worker._current.set_exception(KeyError("items"))  # e.g. a malformed result frame
        with pytest.raises(ServeError) as failed:
            await future
        assert failed.value.status_code == 500
        assert worker.state is WorkerState.READY  # the worker stays in service
        assert dispatcher.in_flight == 0

    asyncio.run(scenario())
    assert any(r.exc_info and "Running a batch" in r.getMessage() for r in caplog.records)


# ----- a worker's state has one writer ---------------------------------------------------------

_S = WorkerState


@pytest.mark.parametrize(
    ("current", "wanted", "after"),
    [
        (_S.STARTING, _S.READY, _S.READY),  # loaded
        (_S.STARTING, _S.BUSY, _S.STARTING),  # never handed work before it loads
        (_S.READY, _S.BUSY, _S.BUSY),
        (_S.BUSY, _S.READY, _S.READY),
        (_S.BUSY, _S.STOPPING, _S.STOPPING),
        (_S.READY, _S.DEAD, _S.DEAD),
        (_S.STOPPING, _S.READY, _S.STOPPING),  # a batch that ends does not bring it back
        (_S.STOPPING, _S.BUSY, _S.STOPPING),
        (_S.STOPPING, _S.DEAD, _S.DEAD),
        (_S.DEAD, _S.READY, _S.DEAD),  # nothing leaves DEAD
        (_S.DEAD, _S.STOPPING, _S.DEAD),  # stopping a dead worker leaves it dead
        (_S.READY, _S.READY, _S.READY),
    ],
)
def test_worker_state_moves_follow_one_table(
    current: WorkerState, wanted: WorkerState, after: WorkerState
) -> None:
    assert next_state(current, wanted) is after


def test_nothing_in_serve_assigns_a_worker_state_but_through_change_state() -> None:
    public, private = [], set()
    for path in Path(serve.__file__).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Assign) or not isinstance(node.value, ast.Attribute):
                continue
            if not (
                isinstance(node.value.value, ast.Name) and node.value.value.id == "WorkerState"
            ):
                continue
            for target in node.targets:
                if isinstance(target, ast.Attribute) and target.attr == "state":
                    public.append(f"{path.name}:{node.lineno}")
                elif isinstance(target, ast.Attribute) and target.attr == "_state":
                    private.add(path.name)
    assert public == []
    assert private == {"process.py"}  # the process handle sets its first state in __init__


def test_a_worker_that_begins_to_stop_mid_batch_is_not_made_ready_again() -> None:
    async def scenario() -> None:
        dispatcher, pool, _ = make(1)
        (worker,) = pool.workers_
        future = dispatcher.submit(item())
        await until(lambda: worker.holding)
        assert worker.change_state(WorkerState.STOPPING)  # the pool recycles or retires it
        worker.finish()
        assert (await future).status == 200
        await ticks()
        assert worker.state is WorkerState.STOPPING
        dispatcher.submit(item())
        await ticks()
        assert len(worker.sent) == 1  # it takes no further batch

    run(scenario)
