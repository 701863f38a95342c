"""``python -m bench.bigjson``: does a client looping big OIP JSON bodies stall another model?

The scenario of issue 27, item 7: one client posts ~6 MB Open Inference Protocol JSON bodies
(FP32, then BYTES, over and over; each declares more than ``max_request_elements`` elements, so
every one is refused with 413) to ``/v2/models/big/infer``, while another model gets small
predictions at a fixed rate (50/s, open loop: a slow answer does not slow the schedule). The
figure is the small model's latency (p50, p99, max) and its status codes, next to the same
neighbour alone (no big client), for this tree and, with ``--base DIR``, another tree (a checkout
of an older commit) in the same rounds: the machine may be shared, so only side by side figures
compare.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import http.client
import json
import os
import statistics
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from archiver import build
from bench.server import LanternProcess

REPO = Path(__file__).resolve().parent.parent
HANDLER = """
def handle(data, context):
    if data is None:
        return None
    return ["ok" for _ in data]
"""
ELEMENTS = 1_200_000  # over the default max_request_elements (1 << 20)


def big_bodies() -> dict[str, bytes]:
    """~6 MB each (under the default max_request_size of 6,553,500 bytes)."""
    fp32 = {"inputs": [{"name": "x", "shape": [ELEMENTS], "datatype": "FP32"}]}
    fp32["inputs"][0]["data"] = [0.25] * ELEMENTS
    strings = {"inputs": [{"name": "x", "shape": [ELEMENTS], "datatype": "BYTES"}]}
    strings["inputs"][0]["data"] = ["ab"] * ELEMENTS
    return {
        name: json.dumps(doc, separators=(",", ":")).encode()
        for name, doc in (("FP32", fp32), ("BYTES", strings))
    }


def build_store(work: Path) -> Path:
    store = work / "store"
    store.mkdir(parents=True, exist_ok=True)
    handler = work / "ok_handler.py"
    handler.write_text(HANDLER)
    for name in ("big", "small"):
        build(
            model_name=name,
            version="1.0",
            handler=str(handler),
            export_path=str(store),
            archive_format="no-archive",
            force=True,
        )
    return store


def _post(base: str, path: str, body: bytes, timeout: float = 30.0) -> int:
    parts = urlsplit(base)
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=timeout)
    try:
        conn.request("POST", path, body, {"Content-Type": "application/json"})
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


def big_client(base: str, bodies: dict[str, bytes], stop: threading.Event) -> Counter[str]:
    """Post the big bodies in turn until ``stop``; counts ``"<kind> <status>"``."""
    seen: Counter[str] = Counter()
    kinds = list(bodies)
    i = 0
    while not stop.is_set():
        kind = kinds[i % len(kinds)]
        i += 1
        try:
            status = _post(base, "/v2/models/big/infer", bodies[kind])
        except OSError as exc:
            seen[f"{kind} {type(exc).__name__}"] += 1
            continue
        seen[f"{kind} {status}"] += 1
    return seen


def neighbour(base: str, rate: float, count: int) -> tuple[list[float], Counter[int]]:
    """``count`` small predictions at ``rate``/s, each started on schedule; latencies in s."""
    latencies: list[float] = []
    statuses: Counter[int] = Counter()
    lock = threading.Lock()

    def one() -> None:
        started = time.perf_counter()
        try:
            status = _post(base, "/predictions/small", b"1")
        except OSError:
            status = 0
        with lock:
            latencies.append(time.perf_counter() - started)
            statuses[status] += 1

    with cf.ThreadPoolExecutor(64) as pool:
        start = time.perf_counter()
        for k in range(count):
            delay = start + k / rate - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            pool.submit(one)
    return latencies, statuses


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def measure(base: str, bodies: dict[str, bytes] | None, rate: float, count: int) -> dict[str, Any]:
    stop = threading.Event()
    big: cf.Future[Counter[str]] | None = None
    with cf.ThreadPoolExecutor(1) as pool:
        if bodies is not None:
            big = pool.submit(big_client, base, bodies, stop)
            time.sleep(0.5)  # the big client is under way
        latencies, statuses = neighbour(base, rate, count)
        stop.set()
        big_counts = dict(big.result()) if big is not None else {}
    return {
        "p50_ms": 1e3 * statistics.median(latencies),
        "p99_ms": 1e3 * _percentile(latencies, 0.99),
        "max_ms": 1e3 * max(latencies),
        "statuses": dict(statuses),
        "big": big_counts,
    }


def _start(tree: Path, work: Path, store: Path) -> LanternProcess:
    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = str(tree)
    try:
        process = LanternProcess(work, store, ["big", "small"], "auto", ["--no-grpc"])
        process.cwd = tree
        return process.start()
    finally:
        if saved is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", type=Path, help="another tree to measure side by side")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--rate", type=float, default=50.0)
    parser.add_argument("--count", type=int, default=400)
    parser.add_argument("--work", type=Path, default=Path("/tmp/lantern-bench-bigjson"))
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    args = parser.parse_args()
    store = build_store(args.work)
    bodies = big_bodies()
    trees = {"this": REPO, **({"base": args.base.resolve()} if args.base else {})}
    rows: list[tuple[str, int, str, dict[str, Any]]] = []
    for name, tree in trees.items():
        with _start(tree, args.work / name, store) as server:
            url = server.addresses["inference"]
            for r in range(args.rounds):
                for load in ("alone", "big bodies"):
                    result = measure(
                        url, bodies if load != "alone" else None, args.rate, args.count
                    )
                    rows.append((name, r, load, result))
                    print(f"[bigjson] {name} round {r} {load}: {result}", file=sys.stderr)
    print(
        f"\n{'tree':<6} {'round':>5} {'load':<11} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}  "
        "small statuses / big answers"
    )
    for name, r, load, res in rows:
        print(
            f"{name:<6} {r:>5} {load:<11} {res['p50_ms']:>8.1f} {res['p99_ms']:>8.1f} "
            f"{res['max_ms']:>8.1f}  {res['statuses']} {res['big']}"
        )
    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out / f"bigjson-{time.strftime('%Y%m%d-%H%M%S')}.json"
    records = [{"tree": n, "round": r, "load": load, **res} for n, r, load, res in rows]
    out.write_text(json.dumps(records, indent=1, default=str))
    print(f"\n{out}")


if __name__ == "__main__":
    main()
