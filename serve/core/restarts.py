"""When to restart a worker that exited unasked: at once, or after a back-off (pure).

A worker that had become READY and then served (a batch answered) or stayed READY for
``settled_after`` seconds crashed in service: an isolated crash, whose replacement starts at once.
One that died right after READY, without serving, is taken for a crash loop and waits as
TorchServe's restarts do (`serve.core.pool.backoff_delay`). Immediate restarts are rate-limited
per model version: at most ``per_minute`` in any 60 s, then the next ones back off too, so a model
that crashes on every request cannot turn the machine into a process factory.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

RATE_WINDOW_S = 60.0

# TorchServe's restart back-off, in seconds; capped by `worker_restart_max_backoff`.
BACKOFF = (0, 1, 1, 2, 3, 5, 8, 13, 21, 34, 55, 89)


def backoff_delay(attempt: int, max_backoff: float) -> float:
    """Seconds to wait before restart number ``attempt`` (0-based) of a crash streak."""
    step = BACKOFF[min(max(attempt, 0), len(BACKOFF) - 1)]
    return float(min(step, max_backoff))


@dataclass(frozen=True, slots=True)
class Exit:
    """What the pool knows of a worker that just exited unasked."""

    uptime: float  # seconds it was READY
    served: int  # batches it answered
    streak: int  # crashes in a row of this slot before this one
    recent: Sequence[float]  # when this version's earlier immediate restarts were (monotonic)
    now: float


@dataclass(frozen=True, slots=True)
class RestartPolicy:
    """The configured limits (`worker_restart_*` keys)."""

    max_backoff: float
    stable_after: float  # up this long: the streak starts over (`worker_restart_backoff_reset`)
    settled_after: float  # READY this long, or served once: a crash in service
    per_minute: int  # immediate restarts allowed per version in any 60 s; 0: always back off


@dataclass(frozen=True, slots=True)
class Restart:
    """The decision: the slot's new crash streak, the delay, and whether it counts as immediate."""

    streak: int
    delay: float
    immediate: bool
    reason: str  # for the log line


def decide_restart(exit: Exit, policy: RestartPolicy) -> Restart:
    """The restart of a worker that exited unasked (see the module's docstring)."""
    in_window = sum(1 for t in exit.recent if exit.now - t < RATE_WINDOW_S)
    in_service = exit.served > 0 or exit.uptime >= policy.settled_after
    # The streak counts every crash in a row, immediate restarts included: once the limit is
    # reached, the back-off is that of a streak that long.
    streak = 1 if exit.uptime >= policy.stable_after else exit.streak + 1
    if in_service and in_window < policy.per_minute:
        return Restart(streak, 0.0, True, "it crashed in service")
    delay = backoff_delay(streak - 1, policy.max_backoff)
    if in_service:
        return Restart(
            streak, delay, False, f"over {policy.per_minute} immediate restarts a minute"
        )
    return Restart(streak, delay, False, "it died right after it became ready")
