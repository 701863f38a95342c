"""The restart decision (`serve.core.restarts.decide_restart`), table-tested."""

from __future__ import annotations

import pytest

from serve.core.restarts import Exit, Restart, RestartPolicy, backoff_delay, decide_restart

POLICY = RestartPolicy(max_backoff=30.0, stable_after=60.0, settled_after=1.0, per_minute=3)
NOW = 1000.0


@pytest.mark.parametrize(
    ("uptime", "served", "streak", "recent", "expected"),
    [
        # A worker that served a batch, or stayed READY a while, crashed in service: at once,
        # whatever its streak (isolated crashes 3 s apart never wait).
        (0.2, 1, 0, (), (1, 0.0, True)),
        (3.0, 0, 0, (), (1, 0.0, True)),
        (3.0, 0, 4, (NOW - 9, NOW - 6, NOW - 70), (5, 0.0, True)),
        (1.0, 0, 2, (), (3, 0.0, True)),
        # Dead right after READY without serving: a crash loop walks TorchServe's back-off.
        (0.5, 0, 0, (), (1, 0.0, False)),
        (0.5, 0, 1, (), (2, 1.0, False)),
        (0.99, 0, 3, (), (4, 2.0, False)),
        (0.1, 0, 6, (), (7, 8.0, False)),
        (0.1, 0, 50, (), (51, 30.0, False)),  # capped by worker_restart_max_backoff
        # The crash-rate limit: three immediate restarts in the last minute, then back-off as
        # long as the streak says (a model that crashes on every request).
        (5.0, 2, 3, (NOW - 30, NOW - 20, NOW - 10), (4, 2.0, False)),
        (5.0, 2, 9, (NOW - 59, NOW - 20, NOW - 10), (10, 30.0, False)),
        # ...and the window slides: restarts older than 60 s no longer count.
        (5.0, 2, 3, (NOW - 61, NOW - 20, NOW - 10), (4, 0.0, True)),
        # A worker up for worker_restart_backoff_reset ends the streak.
        (60.0, 0, 7, (), (1, 0.0, True)),
        (86_400.0, 9, 50, (NOW - 1, NOW - 2, NOW - 3), (1, 0.0, False)),
    ],
)
def test_decide_restart(
    uptime: float,
    served: int,
    streak: int,
    recent: tuple[float, ...],
    expected: tuple[int, float, bool],
) -> None:
    decision = decide_restart(Exit(uptime, served, streak, recent, NOW), POLICY)
    assert (decision.streak, decision.delay, decision.immediate) == expected


def test_no_immediate_restarts_when_the_limit_is_zero() -> None:
    policy = RestartPolicy(max_backoff=30.0, stable_after=60.0, settled_after=1.0, per_minute=0)
    decision = decide_restart(Exit(10.0, 5, 1, (), NOW), policy)
    assert decision == Restart(2, 1.0, False, "over 0 immediate restarts a minute")


def test_backoff_delay_is_torchserve_sequence_capped() -> None:
    assert [backoff_delay(i, 30.0) for i in range(12)] == [
        0, 1, 1, 2, 3, 5, 8, 13, 21, 30, 30, 30,
    ]  # fmt: skip
    assert backoff_delay(-1, 30.0) == 0.0
    assert backoff_delay(5, 2.0) == 2.0
