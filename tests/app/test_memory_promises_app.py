"""Memory admission counts what it promised (issue 27, item 4), through the management app.

A worker still starting has no RSS worth the name yet (a fake one has no process at all): the
registry counts what it admitted it with until it is loaded, so registrations side by side, and
the function nodes of one workflow (registered side by side), cannot over-commit
``worker_memory_limit_mb``; a workflow refused part-way is rolled back whole.
"""

from __future__ import annotations

import asyncio
import json
import zipfile
from pathlib import Path

from archiver.workflow import WORKFLOW_MANIFEST_PATH
from tests.support.fake_workers import Behaviour, FakeWorker, FakeWorkers, echo
from tests.support.inprocess import Lantern, in_process, run, test_config, until
from tests.support.server import build_archive

HANDLERS = Path(__file__).resolve().parents[1] / "support" / "handlers"
LIMIT_MB = 800
PER_WORKER_MB = 100  # 8 workers fit the limit (no reserve)


class Gate:
    """Worker loads that wait until the test opens the gate: the workers stay STARTING."""

    def __init__(self) -> None:
        self.open = asyncio.Event()
        self.waiting = 0

    async def load(self, worker: FakeWorker) -> None:
        self.waiting += 1
        await self.open.wait()


def _config(tmp_path: Path, store: Path) -> object:
    return test_config(
        tmp_path,
        store,
        worker_memory_limit_mb=LIMIT_MB,
        memory_reserve_mb=0,
        enable_model_api=True,
    )


def test_registrations_side_by_side_cannot_over_commit(tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    config = {"memoryPerWorkerMB": PER_WORKER_MB}
    for name in ("a", "b", "c", "d"):
        build_archive(store, name, HANDLERS / "gate_handler.py", config=config)
    gate = Gate()
    fakes = FakeWorkers({"gate_handler": Behaviour(echo, load=gate.load)})

    async def register(lantern: Lantern, name: str, workers: int) -> int:
        response = await lantern.management.post(
            "/models",
            params={"url": f"{name}.mar", "initial_workers": workers, "synchronous": "true"},
        )
        return response.status_code

    async def test() -> None:
        async with in_process(_config(tmp_path, store), fakes) as lantern:  # type: ignore[arg-type]
            # 5 + 5 workers of 100 MB under an 800 MB limit: one of the two must be refused,
            # while the admitted one's workers are still loading.
            both = [asyncio.ensure_future(register(lantern, n, 5)) for n in ("a", "b")]
            await until(lambda: any(t.done() for t in both))
            assert sorted(t.result() for t in both if t.done()) == [507]
            await until(lambda: gate.waiting == 5)  # the admitted ones are loading
            gate.open.set()
            assert sorted(await asyncio.gather(*both)) == [200, 507]
            assert len([w for w in fakes.started if w.state.name != "DEAD"]) == 5
            # The promise ends with the start, counted once: 3 more fit, then nothing.
            assert await register(lantern, "c", 3) == 200
            assert await register(lantern, "d", 1) == 507
            refused = await lantern.management.put(
                "/models/c", params={"min_worker": 4, "synchronous": "true"}
            )
            assert refused.status_code == 507, refused.text
            models = (await lantern.management.get("/models")).json()["models"]
            assert sorted(m["modelName"] for m in models) in (["a", "c"], ["b", "c"])

    run(test)


def _function_war(path: Path, nodes: int) -> Path:
    """A workflow of ``nodes`` function nodes in a chain, one worker each."""
    names = [f"f{i}" for i in range(nodes)]
    dag = "\n".join(f"  {a}: [{b}]" for a, b in zip(names, names[1:], strict=False))
    spec = "models:\n  min-workers: 1\n  max-workers: 1\ndag:\n" + dag + "\n"
    handler = "\n".join(f"def {n}(data, context):\n    return data\n" for n in names)
    manifest = {
        "createdOn": "01/12/2026 10:00:00",
        "workflow": {"workflowName": path.stem, "specFile": "spec.yaml", "handler": "h.py"},
        "archiverVersion": "0.2.15",
    }
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(WORKFLOW_MANIFEST_PATH, json.dumps(manifest))
        zf.writestr("spec.yaml", spec)
        zf.writestr("h.py", handler)
    return path


def test_a_workflow_over_the_limit_is_refused_and_rolled_back(tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    # A function node's worker is estimated at 64 MB and a little: 12 fit in 800 MB, 20 do not.
    _function_war(store / "big.war", 20)
    _function_war(store / "small.war", 6)
    fakes = FakeWorkers({"h": Behaviour(echo)})

    async def test() -> None:
        async with in_process(_config(tmp_path, store), fakes) as lantern:  # type: ignore[arg-type]
            big = await lantern.management.post("/workflows", params={"url": "big.war"})
            assert big.status_code == 500, big.text  # TorchServe's "failed to register"
            assert "Not enough memory" in big.text
            assert lantern.registry.models == {}
            assert [w for w in fakes.started if w.state.name != "DEAD"] == []
            assert (await lantern.management.get("/workflows")).json()["workflows"] == []
            # Nothing stays promised: a workflow that fits is admitted afterwards.
            small = await lantern.management.post("/workflows", params={"url": "small.war"})
            assert small.status_code == 200, small.text
            assert len(lantern.registry.models) == 6

    run(test)
