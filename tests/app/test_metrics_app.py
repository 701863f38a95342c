"""The metrics app in process over fake workers: request counters, batches, status codes, restarts.

What the worker reports (handler phases, custom handler metrics) and what its process shows
(resident memory) stays in `tests/e2e/test_metrics.py`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from serve.core.jobs import BatchItem, ItemResult
from serve.wire.errors import ServeError
from tests.support.fake_workers import Behaviour, FakeWorker, FakeWorkers, body_text, json_result
from tests.support.inprocess import Lantern, in_process, run, test_config
from tests.support.server import HANDLERS, build_archive, echo_archive

OBS = {"model_name": "obs", "model_version": "1.0"}
MV = {"model": "obs", "version": "1.0"}
SLEEP = 0.05  # per batch, as tests/support/handlers/metrics_handler.py sleeps


async def observed(worker: FakeWorker, items: list[BatchItem]) -> list[ItemResult | ServeError]:
    """``metrics_handler.py`` in Python: one sleep per batch, ``boom`` raises."""
    await asyncio.sleep(SLEEP)
    if any(body_text(it) == "boom" for it in items):
        raise RuntimeError("boom requested")
    return [json_result({"batch": len(items)}) for _ in items]


def serve(root: Path, test: Callable[[Lantern], Awaitable[None]]) -> None:
    store = root / "store"
    store.mkdir()
    build_archive(
        store,
        "obs",
        HANDLERS / "metrics_handler.py",
        config={"batchSize": 8, "maxBatchDelay": 50, "minWorkers": 1, "maxWorkers": 1},
    )
    echo_archive(store, config={"minWorkers": 1, "maxWorkers": 1})
    workers = FakeWorkers({"metrics_handler": Behaviour(observed)})

    async def body() -> None:
        config = test_config(root, store, load_models=["obs.mar", "echo.mar"])
        async with in_process(config, workers) as lantern:
            await test(lantern)

    run(body)


async def scrape(lantern: Lantern, *names: str) -> dict[str, object]:
    response = await lantern.metrics.get("/metrics", params=[("name[]", n) for n in names])
    assert response.status_code == 200
    return {f.name: f for f in text_string_to_metric_families(response.text)}


def value(families: dict[str, object], sample: str, **labels: str) -> float:
    """The first sample named ``sample`` whose labels include ``labels``; 0 if none yet."""
    for family in families.values():
        for s in family.samples:  # type: ignore[attr-defined]
            if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items()):
                return float(s.value)
    return 0.0


async def predict(lantern: Lantern, body: bytes, model: str = "obs") -> httpx.Response:
    return await lantern.inference.post(f"/predictions/{model}", content=body)


def test_counters_say_n_after_n_requests(tmp_path: Path) -> None:
    async def test(lantern: Lantern) -> None:
        before = await scrape(lantern)
        n = 6
        for i in range(n - 1):
            assert (await predict(lantern, f"r{i}".encode())).status_code == 200
        # An explicit version lands on the same series as the default one.
        response = await lantern.inference.post("/predictions/obs/1.0", content=b"v")
        assert response.status_code == 200
        after = await scrape(lantern)

        def delta(sample: str, **labels: str) -> float:
            return value(after, sample, **labels) - value(before, sample, **labels)

        assert delta("ts_inference_requests_total", **OBS) == n
        assert delta("serve_requests_total", status="200", **MV) == n
        assert delta("serve_request_duration_seconds_count", **MV) == n
        # TorchServe sums microseconds: at least the handler's 50 ms sleep per request.
        assert delta("ts_inference_latency_microseconds_total", **OBS) >= n * 50_000
        assert delta("ts_queue_latency_microseconds_total", **OBS) >= 0
        # Requests2XX counts every response on every port: the predictions and the first scrape.
        assert delta("Requests2XX_total") == n + 1

    serve(tmp_path, test)


def test_batches_form_under_concurrent_load(tmp_path: Path) -> None:
    async def test(lantern: Lantern) -> None:
        names = ("serve_batch_size", "serve_queue_wait_seconds")
        before = await scrape(lantern, *names)
        count = 24
        tasks = [asyncio.create_task(predict(lantern, f"c{i}".encode())) for i in range(count)]
        depth = in_flight = 0.0
        while not all(t.done() for t in tasks):
            families = await scrape(lantern, "serve_queue_depth", "serve_requests_in_flight")
            depth = max(depth, value(families, "serve_queue_depth", **MV))
            in_flight = max(in_flight, value(families, "serve_requests_in_flight", **MV))
            await asyncio.sleep(0.005)
        responses = [t.result() for t in tasks]
        assert [r.status_code for r in responses] == [200] * count
        sizes = [r.json()["batch"] for r in responses]
        after = await scrape(lantern, *names)

        def delta(sample: str, **labels: str) -> float:
            return value(after, sample, **labels) - value(before, sample, **labels)

        batches = delta("serve_batch_size_count", **MV)
        assert delta("serve_batch_size_sum", **MV) == count
        assert max(sizes) > 1
        assert batches < count
        # The histogram shows the batches that formed: fewer of size 1 than batches in all.
        assert delta("serve_batch_size_bucket", le="1.0", **MV) < batches
        assert delta("serve_batch_size_bucket", le="8.0", **MV) == batches  # batchSize 8
        assert delta("serve_queue_wait_seconds_count", **MV) == count
        assert in_flight > 0 and depth > 0  # what an autoscaler watches, seen while it happened
        idle = await scrape(lantern, "serve_queue_depth", "serve_requests_in_flight")
        assert value(idle, "serve_queue_depth", **MV) == 0
        assert value(idle, "serve_requests_in_flight", **MV) == 0

    serve(tmp_path, test)


def test_status_codes_are_counted(tmp_path: Path) -> None:
    async def test(lantern: Lantern) -> None:
        before = await scrape(lantern)
        assert (await predict(lantern, b"boom")).status_code == 500
        assert (await predict(lantern, b"x", model="no-such-model")).status_code == 404
        after = await scrape(lantern)

        def delta(sample: str, **labels: str) -> float:
            return value(after, sample, **labels) - value(before, sample, **labels)

        assert delta("serve_requests_total", status="500", **MV) == 1
        assert delta("Requests5XX_total") == 1
        assert delta("Requests4XX_total") == 1
        # No series for a model name nobody registered.
        assert not any(
            s.labels.get("model") == "no-such-model"
            for f in after.values()
            for s in f.samples  # type: ignore[attr-defined]
        )

    serve(tmp_path, test)


def test_worker_restart_is_counted(tmp_path: Path) -> None:
    async def test(lantern: Lantern) -> None:
        labels = {"model": "echo", "version": "1.0"}
        before = value(await scrape(lantern), "serve_worker_restarts_total", **labels)
        assert (await predict(lantern, b"crash", model="echo")).status_code >= 500
        crashed = next(w for w in lantern.workers.started if w.model.name == "echo")
        assert crashed.exit_code == 3
        families: dict[str, object] = {}

        async def restarted() -> bool:
            families.update(await scrape(lantern))
            counted = value(families, "serve_worker_restarts_total", **labels) == before + 1
            return counted and value(families, "serve_workers", state="READY", **labels) == 1

        async def restart_counted() -> None:
            while not await restarted():
                await asyncio.sleep(0.01)

        await asyncio.wait_for(restart_counted(), 30)
        assert (await predict(lantern, b"again", model="echo")).status_code == 200

    serve(tmp_path, test)


def test_name_filter_returns_only_named_families(tmp_path: Path) -> None:
    async def test(lantern: Lantern) -> None:
        assert (await predict(lantern, b"x")).status_code == 200
        families = await scrape(
            lantern,
            "ts_inference_requests_total",
            "ts_inference_latency_microseconds",
            "serve_batch_size",
            "Requests2XX",
        )
        assert set(families) == {
            "ts_inference_requests",
            "ts_inference_latency_microseconds",
            "serve_batch_size",
            "Requests2XX",
        }
        assert await scrape(lantern, "no_such_metric") == {}

    serve(tmp_path, test)


def test_metrics_port_serves_only_metrics(tmp_path: Path) -> None:
    async def test(lantern: Lantern) -> None:
        assert (await lantern.metrics.get("/nope")).status_code == 404
        assert (await lantern.metrics.post("/metrics")).status_code == 405

    serve(tmp_path, test)
