"""bench.scaleup's windowing, a pure function of the timeline: which request counts where."""

from __future__ import annotations

import math

from bench.scaleup import Trial, windows, worst_window


def test_requests_fall_in_a_window_by_their_send_time() -> None:
    start, put, ready = 100.0, 104.0, 106.0
    timeline = [
        (100.5, 0.001),  # the first second: connections warming up, in no window
        (103.9, 0.002),  # before the PUT
        (104.0, 0.003),  # at the PUT: during
        (106.5, 0.004),  # the last READY + 0.5 s: still during
        (106.6, 0.005),  # after
    ]
    got = windows(timeline, start, put, ready)
    assert got == {"before": [2.0], "during": [3.0, 4.0], "after": [5.0]}


def test_without_all_workers_ready_the_rest_of_the_run_is_during() -> None:
    got = windows([(105.0, 0.001), (130.0, 0.002)], 100.0, 104.0, None)
    assert got == {"before": [], "during": [1.0, 2.0], "after": []}


def test_the_worst_window_finds_a_short_spike_a_whole_window_p99_dilutes() -> None:
    # 1 ms every 10 ms for 10 s after the PUT, but 50 ms answers for 0.2 s at t=5 s.
    timeline = [(10.0 + i / 100, 0.05 if 500 <= i < 520 else 0.001) for i in range(1000)]
    assert worst_window(timeline, put=10.0, ready=19.5) == 50.0
    assert math.isnan(worst_window(timeline[:10], put=10.0, ready=19.5))  # too few to judge


def test_the_spike_ratio_is_against_the_higher_steady_state() -> None:
    trial = Trial("x", p99={"before": 4.0, "during": 10.0, "after": 8.0})
    assert trial.ratio == 2.5
    assert trial.spike == 1.25
