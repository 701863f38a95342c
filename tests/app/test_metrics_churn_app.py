"""A model's series leave /metrics with its last version (issue 27, item 8): churned names do not
pile up (30 of them took the exposition from 145 to 326 KB)."""

from __future__ import annotations

from pathlib import Path

from tests.support.inprocess import Lantern, in_process, run, test_config
from tests.support.server import echo_archive

NAMES = [f"churn{i}" for i in range(30)]


async def exposition(lantern: Lantern) -> str:
    response = await lantern.metrics.get("/metrics")
    assert response.status_code == 200
    return response.text


async def use(lantern: Lantern, name: str) -> None:
    """Register ``name``, give it 200s, a 500, a restart and a handler metric; then remove it."""
    registered = await lantern.management.post(
        "/models", params={"url": "echo.mar", "model_name": name, "initial_workers": 1}
    )
    assert registered.status_code == 200, registered.text
    for body in ("hello", "boom", "hello"):
        await lantern.inference.post(f"/predictions/{name}", content=body)
    await lantern.inference.post(f"/predictions/{name}/1.0", content="hello")
    lantern.server.metrics.worker_restarted(name, "1.0")
    lantern.server.metrics.custom(
        [
            {
                "name": "HandlerTime",
                "unit": "ms",
                "type": "gauge",
                "value": 1.0,
                "dimensions": {"ModelName": name, "Level": "Model"},
            }
        ]
    )


def test_unregistered_models_leave_no_series_behind(tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    echo_archive(store)

    async def test() -> None:
        config = test_config(tmp_path, store, enable_model_api=True)
        async with in_process(config) as lantern:
            await use(lantern, "first")  # every family the churned names use exists already
            baseline = len(await exposition(lantern))
            for name in NAMES:
                await use(lantern, name)
            text = await exposition(lantern)
            assert all(f'"{name}"' in text for name in NAMES)  # the test reaches every family
            assert f'model="{NAMES[0]}",version="1.0"' in text
            assert f'ModelName="{NAMES[0]}"' in text
            for name in NAMES:
                gone = await lantern.management.delete(f"/models/{name}")
                assert gone.status_code == 200, gone.text
            text = await exposition(lantern)
            left = [line for line in text.splitlines() if any(f'"{n}"' in line for n in NAMES)]
            assert left == [], left[:5]
            assert len(text) <= baseline + 2048, (baseline, len(text))  # gauges may move a little
            assert 'model="first"' in text  # a registered model keeps its series

    run(test)
