"""``python -m bench.transport``: the frontend-to-worker path alone for large bodies, with the
shared-memory arena (``serve/wire/shm.py``) on and off.

No HTTP: this process plays the frontend, driving a real worker through ``WorkerProcess`` (the
server's own code) one batch at a time, so the HTTP receipt that dominates ``bench.bigbody`` (and
its noise on a shared machine) is out of the figures. The handler only takes each body's length.
Reported per batch of one body: the CPU of this process (the frontend's side of the transport),
the worker's CPU (receiving the frame, the copy out of the arena, the handler's trivial work) and
the wall time of a round trip. Arena on and off alternate within each repeat.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from pathlib import Path

from archiver import build, open_archive
from bench import procstat
from serve.core.jobs import BatchItem
from serve.wire.messages import WorkerSpec
from serve.worker.process import WorkerProcess

REPO = Path(__file__).resolve().parent.parent

HANDLER = """
def handle(data, context):
    if data is None:
        return None
    return [len(row.get("body") or row.get("data") or b"") for row in data]
"""


def model_spec(work: Path) -> WorkerSpec:
    """The spec of a worker for the length handler (a folder archive in ``work``)."""
    handler = work / "length_handler.py"
    handler.write_text(HANDLER)
    folder = build(
        model_name="length",
        version="1.0",
        handler=str(handler),
        export_path=str(work),
        archive_format="no-archive",
        force=True,
    )
    archive = open_archive(folder, work / "extract")
    return WorkerSpec(
        model_name="length",
        model_version="1.0",
        model_dir=str(archive.model_dir),
        manifest=archive.manifest,
        num_threads=1,
        log_level="WARNING",
    )


async def measure(spec: WorkerSpec, work: Path, arena_mb: int, size: int, n: int) -> dict:
    proc = WorkerProcess("length_1.0-w0", spec, work, arena_bytes=arena_mb << 20)
    await proc.start(120)
    batch = [BatchItem("r", {}, [("body", "application/octet-stream", os.urandom(size))])]
    try:
        for _ in range(5):
            await proc.run_batch(batch)
        assert proc.pid is not None
        worker0, front0, wall0 = procstat.cpu_seconds(proc.pid), time.process_time(), time.time()
        for _ in range(n):
            await proc.run_batch(batch)
        wall = time.time() - wall0
        front = time.process_time() - front0
        worker = (procstat.cpu_seconds(proc.pid) or 0.0) - (worker0 or 0.0)
    finally:
        await proc.stop(5)
    return {"fe_ms": front / n * 1e3, "worker_ms": worker / n * 1e3, "wall_ms": wall / n * 1e3}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,8", help="body sizes in MiB, comma-separated")
    parser.add_argument("--arena-mb", type=int, default=128, help="the arena when on")
    parser.add_argument("--seconds", type=float, default=2.0, help="per size, arena and repeat")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--work", type=Path, default=Path("/tmp/lantern-bench-transport"))
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    args = parser.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    spec = model_spec(args.work)
    print("size     arena  frontend ms  worker ms  round trip ms  (median of repeats)")
    rows = []
    for mib in (int(s) for s in args.sizes.split(",")):
        n = max(10, int(args.seconds * 1000 / (2 + 2 * mib)))  # ~2 s at ~2 ms + 2 ms/MiB
        runs: dict[int, list[dict]] = {0: [], args.arena_mb: []}
        for _ in range(args.repeats):
            for arena in runs:
                runs[arena].append(asyncio.run(measure(spec, args.work, arena, mib << 20, n)))
        for arena, samples in runs.items():
            med = {k: statistics.median(s[k] for s in samples) for k in samples[0]}
            rows.append({"size_mib": mib, "arena_mb": arena, **med, "runs": samples})
            print(
                f"{mib:>3} MiB  {'on' if arena else 'off':>5}  {med['fe_ms']:>11.2f}"
                f"  {med['worker_ms']:>9.2f}  {med['wall_ms']:>13.2f}"
            )
    load = os.getloadavg()[0]
    print(f"load average {load:.2f}")
    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out / f"transport-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps({"rows": rows, "load_average": load}, indent=1))
    print(f"JSON: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
