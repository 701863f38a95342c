"""``python -m bench.bigbody``: what 1 MB and 8 MB request bodies cost between HTTP and handler.

The model is the worst case for copying: a handler that views the body as float32 and sums it
(``numpy.frombuffer``; ~1 ms for 8 MB), so every copy on the way shows. For each size it measures,
side by side in one run:

* **raw**: the worker's own ``run_batch`` on that body in a loop, no socket, no HTTP (`bench.raw`);
* **bare**: the bare ASGI app of the same HTTP server draining the same body (`bench.bare`): what
  receiving it over HTTP costs at all;
* **served**: Lantern, one worker, ``c`` clients posting the body.

and reports served/raw throughput, CPU per request of each part, and the **transport share**: the
CPU that the frontend-to-worker path adds (frontend minus bare, worker minus raw) over the served
CPU per request. That share is what shared memory or a zero-copy path could save at most.

``--base DIR`` also serves the same model from another tree (e.g. ``git archive COMMIT | tar -x
-C DIR``) in the same rounds: its served figures appear as the starred rows, side by side.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from archiver import build
from bench import procstat
from bench.load import run_load
from bench.raw import run_raw
from bench.server import BareServer, LanternProcess

REPO = Path(__file__).resolve().parent.parent
HANDLER = """
import numpy as np


def handle(data, context):
    if data is None:
        return None
    out = []
    for row in data:
        body = row.get("body") if row.get("body") is not None else row.get("data")
        values = np.frombuffer(body, dtype=np.float32)
        out.append({"n": int(values.size), "sum": float(values.sum(dtype=np.float64))})
    return out
"""
CONTENT_TYPE = "application/octet-stream"


def _log(message: str) -> None:
    print(f"[bigbody {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def build_model(work: Path) -> Path:
    """A folder archive ``bigsum`` (one worker, one thread, no batching) in ``work/store``."""
    store = work / "store"
    target = store / "bigsum"
    if (target / "MAR-INF" / "MANIFEST.json").exists():
        return target
    store.mkdir(parents=True, exist_ok=True)
    handler = work / "bigsum_handler.py"
    handler.write_text(HANDLER)
    config = work / "bigsum-config.yaml"
    config.write_text("minWorkers: 1\nmaxWorkers: 1\nbatchSize: 1\nnumThreads: 1\n")
    build(
        model_name="bigsum",
        version="1.0",
        handler=str(handler),
        export_path=str(store),
        archive_format="no-archive",
        config_file=str(config),
    )
    return target


def body_file(work: Path, megabytes: int) -> Path:
    path = work / f"body-{megabytes}mb.bin"
    if not path.exists() or path.stat().st_size != megabytes << 20:
        path.write_bytes(os.urandom(megabytes << 20))
    return path


def measure_bare(bare: BareServer, body: Path, concurrency: int, seconds: float) -> dict[str, Any]:
    before = procstat.cpu_seconds(bare.pid) or 0.0
    load = run_load(bare.url, body, CONTENT_TYPE, concurrency=concurrency, seconds=seconds)
    cpu = (procstat.cpu_seconds(bare.pid) or 0.0) - before
    return {"rps": load.rps, "fe_ms": _ms(cpu, load.requests), "errors": load.errors}


def measure_served(
    lantern: LanternProcess, body: Path, concurrency: int, seconds: float
) -> dict[str, Any]:
    """Load for ``seconds`` + 2 × ramp; CPU and requests counted over the middle window."""
    ramp = 0.5
    done: dict[str, Any] = {}
    url = lantern.url("bigsum")

    def drive() -> None:
        done["load"] = run_load(
            url, body, CONTENT_TYPE, concurrency=concurrency, seconds=seconds + 2 * ramp
        )

    loader = threading.Thread(target=drive)
    loader.start()
    time.sleep(ramp)
    hist0 = lantern.batch_histogram("bigsum")
    front0 = procstat.cpu_seconds(lantern.pid) or 0.0
    workers0 = procstat.cpu_snapshot(lantern.worker_pids())
    started = time.perf_counter()
    time.sleep(seconds)
    hist1 = lantern.batch_histogram("bigsum")
    elapsed = time.perf_counter() - started
    workers1 = procstat.cpu_snapshot(lantern.worker_pids())
    front = (procstat.cpu_seconds(lantern.pid) or 0.0) - front0
    loader.join()
    items = int(round(hist1.get("sum", 0.0) - hist0.get("sum", 0.0)))
    workers = procstat.cpu_delta(workers0, workers1)
    load = done["load"]
    return {
        "rps": items / elapsed if elapsed else 0.0,
        "fe_ms": _ms(front, items),
        "worker_ms": _ms(workers, items),
        "p50_ms": load.p50_ms,
        "errors": load.errors,
    }


def _ms(cpu: float, requests: int) -> float | None:
    return cpu / requests * 1000 if requests else None


def summarise(size: int, raw: dict[str, Any], bare: dict[str, Any], served: dict[str, Any]) -> dict:
    raw_ms = raw["cpu_ms_per_item"]
    served_ms = (served["fe_ms"] or 0.0) + (served["worker_ms"] or 0.0)
    transport = (served["fe_ms"] or 0.0) - (bare["fe_ms"] or 0.0)
    transport += (served["worker_ms"] or 0.0) - raw_ms
    return {
        "size_mb": size,
        "raw_rps": raw["items_per_s"],
        "served_rps": served["rps"],
        "served_over_raw": served["rps"] / raw["items_per_s"] if raw["items_per_s"] else None,
        "raw_cpu_ms": raw_ms,
        "bare_fe_ms": bare["fe_ms"],
        "served_fe_ms": served["fe_ms"],
        "served_worker_ms": served["worker_ms"],
        "served_cpu_ms": served_ms,
        "transport_ms": transport,
        "transport_share": transport / served_ms if served_ms else None,
        "errors": served["errors"] + bare["errors"],
    }


def format_rows(rows: list[dict[str, Any]]) -> str:
    head = (
        "size  served/raw  raw/s  served/s  raw cpu  bare fe  served fe  served worker"
        "  transport ms  share"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r['size_mb']:>2} MB{'*' if r.get('tree') else ' '} {r['served_over_raw']:>10.3f}"
            f"  {r['raw_rps']:>5.0f}"
            f"  {r['served_rps']:>8.0f}  {r['raw_cpu_ms']:>7.2f}  {r['bare_fe_ms']:>7.2f}"
            f"  {r['served_fe_ms']:>9.2f}  {r['served_worker_ms']:>13.2f}"
            f"  {r['transport_ms']:>12.2f}  {r['transport_share']:>5.1%}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,8", help="body sizes in MB, comma-separated")
    parser.add_argument("--server", default="uvicorn", help="hypercorn or uvicorn")
    parser.add_argument("-c", "--concurrency", type=int, default=2)
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--work", type=Path, default=Path("/tmp/lantern-bench-bigbody"))
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    parser.add_argument("--base", type=Path, help="another tree to serve side by side")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    work = args.work
    work.mkdir(parents=True, exist_ok=True)
    model = build_model(work)
    os.environ["LANTERN_MAX_REQUEST_SIZE"] = str((max(sizes) << 20) + 4096)
    runs: dict[int, dict[str, list[dict[str, Any]]]] = {
        s: {"raw": [], "bare": [], "served": [], "base": []} for s in sizes
    }
    base = None
    if args.base is not None:
        from bench.ab import _start

        names = ["bigsum=bigsum"]
        base = _start(args.base.resolve(), work / "base", model.parent, names, args.server)
    with (
        BareServer(work, args.server) as bare,
        LanternProcess(work, model.parent, ["bigsum=bigsum"], args.server) as lantern,
    ):
        bare.start()
        lantern.start()
        for rep in range(args.repeats):
            for size in sizes:
                body = body_file(work, size)
                _log(f"{size} MB, repeat {rep + 1}/{args.repeats}")
                runs[size]["raw"].append(
                    run_raw(
                        model,
                        body,
                        CONTENT_TYPE,
                        processes=1,
                        threads=1,
                        batch=1,
                        seconds=args.duration,
                        warmup=0.5,
                    )
                )
                runs[size]["bare"].append(measure_bare(bare, body, args.concurrency, args.duration))
                runs[size]["served"].append(
                    measure_served(lantern, body, args.concurrency, args.duration)
                )
                if base is not None:
                    runs[size]["base"].append(
                        measure_served(base, body, args.concurrency, args.duration)
                    )
    if base is not None:
        base.stop()
    rows = []
    for size in sizes:
        pick = {
            k: _median_run(v, "items_per_s" if k == "raw" else "rps")
            for k, v in runs[size].items()
            if v
        }
        rows.append(summarise(size, pick["raw"], pick["bare"], pick["served"]))
        if "base" in pick:
            base_row = summarise(size, pick["raw"], pick["bare"], pick["base"])
            rows.append({**base_row, "tree": "base"})
    print(format_rows(rows))
    print(
        f"\n{args.server}, 1 worker × 1 thread, c={args.concurrency}, {args.duration:g} s × "
        f"{args.repeats} (median run by throughput); load average {os.getloadavg()[0]:.2f}"
        + ("; * = the --base tree" if base is not None else "")
    )
    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out / f"bigbody-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps({"rows": rows, "runs": runs, "server": args.server}, indent=1))
    print(f"JSON: {out}")
    return 0


def _median_run(samples: list[dict[str, Any]], key: str) -> dict[str, Any]:
    ordered = sorted(samples, key=lambda s: s[key])
    return ordered[len(ordered) // 2]


if __name__ == "__main__":
    sys.exit(main())
