"""The raw baseline: the served model's own handler in a loop, in-process, with no server.

``run_raw`` starts ``processes`` copies of ``python -m bench.raw`` (one per worker the served
configuration would have), each capped at ``threads`` intra-op threads, so the total thread budget
matches. Each loads the archive exactly as a worker does (``serve.worker.main.load``) and runs the
worker's own per-batch code (``serve.worker.main.run_batch``: decode the inputs, ``handle``, encode
the outputs) on batches of ``batch`` copies of the benchmark body, with no socket and no HTTP. All
copies start together on a signal and run for the same time; items per second are summed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from serve.wire.messages import WorkerSpec

REPO = Path(__file__).resolve().parent.parent


def _spec(model_dir: Path, threads: int, batch: int) -> WorkerSpec:
    from archiver import open_archive
    from serve.wire.messages import WorkerSpec

    archive = open_archive(model_dir, model_dir)  # a folder archive is used in place
    return WorkerSpec(
        model_name=archive.model_name,
        model_version=archive.version,
        model_dir=str(archive.model_dir),
        manifest=archive.manifest,
        batch_size=batch,
        num_threads=threads,
        model_yaml_config=archive.model_config,
    )


def _child(args: argparse.Namespace) -> None:
    from serve.wire.frames import Frame, MsgType
    from serve.worker import main as worker

    spec = _spec(Path(args.model_dir), args.threads, args.batch)
    service, context = worker.load(spec)
    worker._cap_threads(spec)
    body = Path(args.body).read_bytes()
    headers = {"content-type": args.content_type, "content-length": str(len(body))}
    frame = Frame(
        MsgType.PREDICT,
        1,
        {
            "requests": [
                {"id": f"r{i}", "headers": headers, "params": [["body", args.content_type]]}
                for i in range(args.batch)
            ]
        },
        (body,) * args.batch,
    )

    def once() -> None:
        result = worker.run_batch(service, context, frame, True)
        if "error" in result.meta["items"][0]:
            raise RuntimeError(f"the handler failed: {result.meta['items'][0]['error']}")

    warm_until = time.perf_counter() + args.warmup
    while time.perf_counter() < warm_until:
        once()
    print("READY", flush=True)
    sys.stdin.readline()  # the parent's go signal: every copy starts together
    cpu0 = time.process_time()
    started = time.perf_counter()
    deadline = started + args.seconds
    batches = 0
    latencies = []
    while True:
        t0 = time.perf_counter()
        once()
        t1 = time.perf_counter()
        latencies.append(t1 - t0)
        batches += 1
        if t1 >= deadline:
            break
    elapsed = time.perf_counter() - started
    latencies.sort()
    print(
        "BENCH_JSON "
        + json.dumps(
            {
                "items": batches * args.batch,
                "seconds": elapsed,
                "cpu_s": time.process_time() - cpu0,
                "batch_p50_ms": latencies[len(latencies) // 2] * 1000,
            }
        ),
        flush=True,
    )


def run_raw(
    model_dir: Path,
    body: Path,
    content_type: str,
    *,
    processes: int,
    threads: int,
    batch: int,
    seconds: float,
    warmup: float = 1.0,
) -> dict[str, Any]:
    """Run the baseline; returns items/s (summed), CPU seconds per item and per-batch p50."""
    env = dict(os.environ)
    for key in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env[key] = str(threads)
    cmd = [
        sys.executable,
        "-m",
        "bench.raw",
        "--model-dir",
        str(model_dir),
        "--body",
        str(body),
        "--content-type",
        content_type,
        "--threads",
        str(threads),
        "--batch",
        str(batch),
        "--seconds",
        str(seconds),
        "--warmup",
        str(warmup),
    ]
    procs = [
        subprocess.Popen(
            cmd,
            cwd=REPO,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(processes)
    ]
    try:
        for proc in procs:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            if line.strip() != "READY":
                raise RuntimeError(f"raw baseline failed to load: {line}{proc.communicate()[1]}")
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        results = []
        for proc in procs:
            out, err = proc.communicate(timeout=seconds + 120)
            found = next((ln for ln in out.splitlines() if ln.startswith("BENCH_JSON ")), None)
            if proc.returncode != 0 or found is None:
                raise RuntimeError(f"raw baseline failed ({proc.returncode}): {err[-2000:]}")
            results.append(json.loads(found[len("BENCH_JSON ") :]))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    items = sum(r["items"] for r in results)
    rate = sum(r["items"] / r["seconds"] for r in results)
    cpu = sum(r["cpu_s"] for r in results)
    return {
        "items_per_s": rate,
        "items": items,
        "cpu_ms_per_item": cpu / items * 1000 if items else None,
        "batch_p50_ms": sorted(r["batch_p50_ms"] for r in results)[len(results) // 2],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description="One copy of the raw baseline (internal).")
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--body", required=True)
    parser.add_argument("--content-type", required=True)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--warmup", type=float, default=1.0)
    _child(parser.parse_args())


if __name__ == "__main__":
    main()
