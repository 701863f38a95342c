"""The spec a frontend gives a worker (`serve.core.model.ModelVersion.worker_spec`), for tests that
drive a real worker process through `serve.worker.process.WorkerProcess` without a server."""

from __future__ import annotations

from pathlib import Path

from archiver import build, open_archive
from serve.wire.messages import WorkerSpec


def worker_spec(
    work: Path, handler: Path, *, name: str = "m", batch_size: int = 1, log_level: str = "INFO"
) -> WorkerSpec:
    """Archive ``handler`` (a folder archive in ``work``) and describe it as a worker's spec."""
    folder = build(
        model_name=name,
        version="1.0",
        handler=str(handler),
        export_path=str(work),
        archive_format="no-archive",
        force=True,
    )
    archive = open_archive(folder, work / f"extract-{name}")
    return WorkerSpec(
        model_name=name,
        model_version="1.0",
        model_dir=str(archive.model_dir),
        manifest=archive.manifest,
        batch_size=batch_size,
        num_threads=1,
        log_level=log_level,
    )
