"""Worker memory as the kernel counts it (issue 25, item 2), in process over fake workers that
report this test process's pid: describe's ``memoryPss``/``memoryUss`` beside TorchServe's
``memoryUsage``, the PSS/USS gauges, the frontend's and the spares', and `serve status`'s cells."""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from serve.cli.control import memory_cells, memory_line
from serve.core.host import ProcessMemory
from tests.support.fake_workers import Behaviour, FakeWorkers, echo, loads_as_this_process
from tests.support.inprocess import Lantern, in_process, run, test_config, until
from tests.support.server import echo_archive

TORCHSERVE_WORKER_FIELDS = {
    "id", "startTime", "status", "memoryUsage", "pid", "gpu", "gpuUsage", "gpuMemoryUsage",
}  # fmt: skip


def serve(tmp_path: Path, test: Callable[[Lantern], Awaitable[None]]) -> None:
    store = tmp_path / "store"
    store.mkdir()
    echo_archive(store, config={"minWorkers": 2, "maxWorkers": 2})
    workers = FakeWorkers({"echo_handler": Behaviour(echo, load=loads_as_this_process)})

    async def body() -> None:
        config = test_config(tmp_path, store, load_models=["echo.mar"])
        async with in_process(config, workers) as lantern:
            await test(lantern)

    run(body)


async def _metrics(lantern: Lantern) -> dict[str, list[tuple[dict[str, str], float]]]:
    response = await lantern.metrics.get("/metrics")
    assert response.status_code == 200
    return {
        f.name: [(s.labels, s.value) for s in f.samples]
        for f in text_string_to_metric_families(response.text)
    }


def test_describe_adds_pss_and_uss_beside_torchserve_fields(tmp_path: Path) -> None:
    async def test(lantern: Lantern) -> None:
        (data,) = (await lantern.management.get("/models/echo")).json()
        assert len(data["workers"]) == 2
        for worker in data["workers"]:
            assert TORCHSERVE_WORKER_FIELDS <= worker.keys()
            assert worker["pid"] == os.getpid()
            rss, pss, uss = worker["memoryUsage"], worker["memoryPss"], worker["memoryUss"]
            assert isinstance(pss, int) and isinstance(uss, int)
            assert 0 < uss <= pss <= rss
        cells = memory_cells(data["workers"])
        assert all(c.endswith("MiB") and int(c[:-3]) > 0 for c in cells), cells
        # Two workers that are one process: the sums double it (each worker is counted).
        assert int(cells[0][:-3]) >= 2 * (data["workers"][0]["memoryUsage"] >> 20)

    serve(tmp_path, test)


def test_metrics_report_pss_and_uss_per_worker_and_the_frontend(tmp_path: Path) -> None:
    async def test(lantern: Lantern) -> None:
        families = await _metrics(lantern)
        by_kind: dict[str, float] = {}
        for name in ("resident", "proportional", "unique"):
            samples = families[f"serve_worker_{name}_memory_bytes"]
            assert {s[0]["worker"] for s in samples} == {"echo_1.0-w0", "echo_1.0-w1"}, samples
            assert all(s[0]["model"] == "echo" and s[0]["version"] == "1.0" for s in samples)
            by_kind[name] = samples[0][1]
        assert 0 < by_kind["unique"] <= by_kind["proportional"] <= by_kind["resident"]
        # The frontend is this process too.
        frontend = {
            labels["kind"]: value for labels, value in families["serve_frontend_memory_bytes"]
        }
        assert set(frontend) == {"rss", "pss", "uss"}
        assert 0 < frontend["uss"] <= frontend["pss"] <= frontend["rss"]
        # Fake workers take no spare: none is ready, and the spares hold nothing.
        assert families["serve_spares_ready"] == [({}, 0.0)]
        spare = {labels["kind"]: value for labels, value in families["serve_spare_memory_bytes"]}
        assert spare == {"rss": 0.0, "pss": 0.0, "uss": 0.0}

    serve(tmp_path, test)


def test_status_cells_say_dash_for_a_measure_some_worker_lacks() -> None:
    mib = 1 << 20
    full = {"memoryUsage": 30 * mib, "memoryPss": 20 * mib, "memoryUss": 10 * mib}
    assert memory_cells([full, full]) == ("60MiB", "40MiB", "20MiB")
    older = {"memoryUsage": 30 * mib}  # a server before PSS/USS, or TorchServe
    assert memory_cells([full, older]) == ("60MiB", "-", "-")
    unreadable = {**full, "memoryPss": None, "memoryUss": None}  # no smaps_rollup
    assert memory_cells([unreadable]) == ("30MiB", "-", "-")
    assert memory_cells([]) == ("0MiB", "0MiB", "0MiB")


def test_metrics_report_an_idle_spare(tmp_path: Path) -> None:
    """A real spare (the registry's own pool; nothing learnt yet, so a bare interpreter that
    imports no framework) is counted once ready."""

    async def test(lantern: Lantern) -> None:
        spares = lantern.server.registry.spares
        spares.refill()
        await until(lambda: bool(spares.ready_pids()), 60)
        families = await _metrics(lantern)
        assert families["serve_spares_ready"] == [({}, 1.0)]
        spare = {labels["kind"]: value for labels, value in families["serve_spare_memory_bytes"]}
        assert 0 < spare["uss"] <= spare["pss"] <= spare["rss"]
        (pid,) = spares.ready_pids()
        assert pid != os.getpid()

    serve(tmp_path, test)


def test_status_lines_for_the_frontend_and_the_spares() -> None:
    mib = 1 << 20
    full = ProcessMemory(50 * mib, 40 * mib, 30 * mib)
    assert memory_line("frontend", [full]) == "frontend  RSS 50MiB  PSS 40MiB  USS 30MiB"
    two = memory_line("spares (2 idle)", [full, full])
    assert two == "spares (2 idle)  RSS 100MiB  PSS 80MiB  USS 60MiB"
    assert memory_line("frontend", [ProcessMemory(50 * mib)]) == "frontend  RSS 50MiB  PSS -  USS -"
    assert memory_line("spares (0 idle)", []) == "spares (0 idle)  RSS 0MiB  PSS 0MiB  USS 0MiB"
