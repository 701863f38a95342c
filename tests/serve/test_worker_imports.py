"""A worker imports only what its handler uses (issue 25, item 2): a real, cold worker of a
TorchScript model behind ``base_handler`` maps no torchvision, and says it imported torch alone.

``/proc/PID/maps`` is the worker's own account: importing torchvision maps its ``_C`` library (and
``image.so``), so a worker that imported it shows it there whatever it reports."""

from __future__ import annotations

from pathlib import Path

import torch
import uvloop

from archiver import build, open_archive
from serve.core.jobs import BatchItem, ItemResult
from serve.wire.messages import WorkerSpec
from serve.worker.process import WorkerProcess


def _tiny_spec(work: Path) -> WorkerSpec:
    weights = work / "tiny.pt"
    torch.jit.script(torch.nn.Linear(4, 2)).save(str(weights))
    folder = build(
        model_name="tiny",
        version="1.0",
        handler="base_handler",
        serialized_file=str(weights),
        export_path=str(work),
        archive_format="no-archive",
        force=True,
    )
    archive = open_archive(folder, work / "extract")
    return WorkerSpec(
        model_name="tiny",
        model_version="1.0",
        model_dir=str(archive.model_dir),
        manifest=archive.manifest,
        batch_size=1,
        num_threads=1,
    )


def test_a_torchscript_worker_does_not_import_torchvision(tmp_path: Path) -> None:
    async def scenario() -> None:
        proc = WorkerProcess("tiny_1.0-w0", _tiny_spec(tmp_path), tmp_path, spares=None)
        await proc.start(300)
        try:
            body = b"[[0.1, 0.2, 0.3, 0.4]]"
            result = await proc.run_batch(
                [BatchItem("r0", {}, [("body", "application/json", body)])]
            )
            answer = result.results[0]
            assert isinstance(answer, ItemResult) and answer.status == 200, answer
            assert proc.modules == ["torch"]  # what the worker reports with LOADED
            maps = Path(f"/proc/{proc.pid}/maps").read_text()
            assert "/torch/" in maps  # the check can see a framework's libraries
            assert "torchvision" not in maps
        finally:
            await proc.stop(5)

    uvloop.run(scenario())
