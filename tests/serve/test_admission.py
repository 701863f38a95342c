"""Memory admission: the decision, the evidence it uses and what the host leaves."""

from __future__ import annotations

from pathlib import Path

import pytest

from serve.admission import (
    MIB,
    WORKER_BASE_BYTES,
    Headroom,
    Need,
    decide,
    host_headroom,
    per_worker_need,
    tree_size,
)


@pytest.mark.parametrize(
    ("configured", "measured", "archive", "need"),
    [
        (300, [50 * MIB], 10, Need(300 * MIB, "configured")),
        (None, [50 * MIB, 80 * MIB, 0], 10, Need(80 * MIB, "measured")),
        (None, [], 10 * MIB, Need(WORKER_BASE_BYTES + 20 * MIB, "estimated")),
        (0, [0], 0, Need(WORKER_BASE_BYTES, "estimated")),
    ],
)
def test_per_worker_need(
    configured: int | None, measured: list[int], archive: int, need: Need
) -> None:
    assert per_worker_need(configured, measured, archive) == need


ROOM = Headroom(1000 * MIB, "worker_memory_limit_mb")


@pytest.mark.parametrize(
    ("workers", "per_worker", "reserve", "admitted"),
    [
        (0, 10_000, 0, True),  # nothing to start
        (4, 200, 200, True),  # 800 + 200 reserve = 1000: exactly fits
        (4, 200, 201, False),
        (6, 200, 0, False),
        (1, 2000, 0, False),
        (1, 1, 2000, False),  # the reserve alone exceeds what is free
    ],
)
def test_decide(workers: int, per_worker: int, reserve: int, admitted: bool) -> None:
    need = Need(per_worker * MIB, "measured")
    assert decide('model "m"', workers, need, ROOM, reserve * MIB).admitted is admitted


def test_refusal_says_what_how_much_and_what_to_change() -> None:
    decision = decide('model "m" version 2', 3, Need(400 * MIB, "measured"), ROOM, 100 * MIB)
    assert not decision.admitted
    message = decision.message
    assert 'start 3 workers for model "m" version 2' in message
    assert "1.2 GiB (400 MiB each, measured)" in message
    assert "900 MiB is free (1000 MiB by worker_memory_limit_mb" in message
    assert "reserve of 100 MiB" in message
    assert "memory_reserve_mb" in message and "memoryPerWorkerMB" in message


def test_headroom_takes_the_tightest_bound(tmp_path: Path) -> None:
    cgroup = tmp_path / "cgroup"
    cgroup.mkdir()
    (cgroup / "memory.max").write_text("max\n")
    host = host_headroom(0, 0, cgroup=cgroup)
    assert host.bound == "host MemAvailable" and host.available > 0
    (cgroup / "memory.max").write_text(str(host.available // 2 + 100))
    (cgroup / "memory.current").write_text("100")
    assert host_headroom(0, 0, cgroup=cgroup) == Headroom(host.available // 2, "cgroup memory.max")
    limited = host_headroom(30 * MIB, 100, cgroup=cgroup)
    assert limited == Headroom(70 * MIB, "worker_memory_limit_mb")


def test_tree_size(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "a").write_bytes(b"x" * 10)
    (tmp_path / "d" / "b").write_bytes(b"x" * 5)
    assert tree_size(tmp_path) == 15
