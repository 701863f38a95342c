"""Memory admission: the decision, the evidence it uses and what the host leaves."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from serve.config import Config, ModelSettings
from serve.core.admission import (
    MIB,
    WORKER_BASE_BYTES,
    Headroom,
    Need,
    decide,
    decide_gpus,
    gpu_placements,
    host_headroom,
    per_worker_need,
    tree_size,
    visible_free,
    worker_charge,
)
from serve.core.host import ProcessMemory
from serve.core.registry import Registry
from serve.metrics.prometheus import ServerMetrics
from serve.metrics.system import GpuSample, SystemMetrics
from serve.wire.errors import InsufficientMemory


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


SHARED = ProcessMemory(rss=700 * MIB, pss=300 * MIB, uss=120 * MIB)  # torch's pages shared
NO_ROLLUP = ProcessMemory(rss=700 * MIB)  # smaps_rollup unreadable: RSS stands for both


@pytest.mark.parametrize(
    ("memory", "loaded", "retiring", "promised", "charge"),
    [
        (SHARED, True, False, 500 * MIB, 300 * MIB),  # loaded: its PSS, not its RSS
        (NO_ROLLUP, True, False, 500 * MIB, 700 * MIB),  # loaded, PSS unknown: RSS
        (SHARED, False, False, 500 * MIB, 500 * MIB),  # starting: at least its promise
        (SHARED, False, False, 100 * MIB, 300 * MIB),  # starting past its promise: PSS
        (None, False, False, 500 * MIB, 500 * MIB),  # no process yet (or gone)
        (None, True, False, 500 * MIB, 500 * MIB),  # loaded but unreadable: the promise
        (SHARED, False, True, 500 * MIB, 300 * MIB),  # retiring: only what it holds
        (None, False, True, 500 * MIB, 0),
    ],
)
def test_worker_charge(
    memory: ProcessMemory | None, loaded: bool, retiring: bool, promised: int, charge: int
) -> None:
    assert worker_charge(memory, loaded, retiring, promised) == charge


def test_the_need_measured_is_what_one_more_worker_adds() -> None:
    """Two workers sharing torch: the next one is admitted on USS (120 MiB), where RSS (700
    MiB) would refuse it; their PSS (300 MiB each) is what they hold against the limit."""
    room = Headroom(1000 * MIB - 2 * worker_charge(SHARED, True, False, 0), "limit")
    by_uss = per_worker_need(None, [SHARED.unique_or_rss] * 2, 0)
    assert by_uss == Need(120 * MIB, "measured")
    assert decide("m", 1, by_uss, room, 0).admitted
    assert not decide("m", 1, per_worker_need(None, [SHARED.rss], 0), room, 0).admitted


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


@pytest.mark.parametrize(
    ("workers", "devices", "placements"),
    [
        (0, [0, 1], {}),
        (3, [], {}),
        (1, [0, 1], {0: 1, 1: 1}),  # either device may get it: both are checked
        (3, [0, 1], {0: 2, 1: 2}),
        (4, [2], {2: 4}),
    ],
)
def test_gpu_placements(workers: int, devices: list[int], placements: dict[int, int]) -> None:
    assert gpu_placements(workers, devices) == placements


def test_decide_gpus_checks_each_device() -> None:
    need = Need(4000 * MIB, "measured")
    free = {0: 20_000 * MIB, 1: 5000 * MIB}
    assert decide_gpus("m", {0: 2}, need, free, 0).admitted
    refused = decide_gpus("m", {0: 2, 1: 2}, need, free, 512 * MIB)
    assert not refused.admitted
    assert "m on GPU 1" in refused.message and "GPU 1 (nvidia-smi)" in refused.message
    assert decide_gpus("m", {3: 9}, need, free, 0).admitted  # no sample for GPU 3: unchecked


@pytest.mark.parametrize(
    ("visible", "expected"),
    [
        (None, {0: 10, 1: 20, 2: 30}),
        ("2,0", {0: 30, 1: 10}),
        ("1", {0: 20}),
        ("GPU-abc", {}),  # UUIDs are not matched: unchecked
        ("", {}),
    ],
)
def test_visible_free(visible: str | None, expected: dict[int, int]) -> None:
    assert visible_free({0: 10, 1: 20, 2: 30}, visible) == expected


class _Gpus(SystemMetrics):
    """nvidia-smi's answer, without nvidia-smi."""

    def __init__(self, samples: list[GpuSample]) -> None:
        super().__init__(find_nvidia_smi=False)
        self.samples = samples

    async def gpu_samples(self) -> list[GpuSample]:
        return self.samples


@pytest.mark.parametrize(
    ("workers", "admitted"),
    [(1, True), (2, False)],  # 2 x 4000 MiB + 512 MiB reserve > 6000 MiB free on GPU 0
)
def test_registry_checks_the_gpus_a_model_uses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, workers: int, admitted: bool
) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    gpus = [GpuSample("0", "GPU-a", 2000.0 * MIB, 8000.0 * MIB, 0.0)]
    registry = Registry(Config(), tmp_path, ServerMetrics(system=_Gpus(gpus)))
    settings = ModelSettings(device_ids=[0], gpu_memory_per_worker_mb=4000)
    need = Need(1 * MIB, "configured")  # host memory is not what this is about

    async def admit() -> None:
        await registry._admit("m", "1", workers, need, settings)

    if admitted:
        asyncio.run(admit())
    else:
        with pytest.raises(InsufficientMemory, match="on GPU 0"):
            asyncio.run(admit())
    cpu = ModelSettings(device_type="cpu", gpu_memory_per_worker_mb=4000)
    asyncio.run(registry._admit("m", "1", 99, need, cpu))  # a CPU model: GPUs not checked
