"""``python -m bench.ab --base DIR``: frontend CPU per request, this tree against another.

Both trees serve the tiny model (2 workers, batch 8 / 5 ms) on the same HTTP server at the same
time, next to the bare ASGI ceiling; wrk drives one of the three at a time, alternating, for
``--rounds`` rounds. The figure is the frontend's CPU per request (``/proc``), steadier than req/s
on a shared machine; medians over the rounds. ``--base`` is a checkout of the other tree (e.g.
``git archive COMMIT | tar -x -C DIR``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from bench import procstat
from bench.load import run_load
from bench.models import ModelFactory
from bench.plan import BATCH, DELAY_MS, _w
from bench.server import BareServer, LanternProcess

REPO = Path(__file__).resolve().parent.parent


def _start(tree: Path, work: Path, store: Path, names: list[str], server: str) -> LanternProcess:
    """Lantern from ``tree`` (its root is the working folder and first on the path)."""
    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = str(tree)
    try:
        process = LanternProcess(work, store, names, server)
        process.cwd = tree
        return process.start()
    finally:
        if saved is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved


def _measure(pid: int, url: str, body: Path, ctype: str, c: int, seconds: float) -> dict[str, Any]:
    """req/s, and CPU ms per request of the process (the frontend) and of its children."""
    before = procstat.cpu_seconds(pid) or 0.0
    kids = procstat.cpu_snapshot(procstat.children(pid))
    load = run_load(url, body, ctype, concurrency=c, seconds=seconds)
    cpu = (procstat.cpu_seconds(pid) or 0.0) - before
    workers = procstat.cpu_delta(kids, procstat.cpu_snapshot(procstat.children(pid)))
    per = 1000 / load.requests if load.requests else 0.0
    return {"rps": load.rps, "fe_ms": cpu * per, "worker_ms": workers * per}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", type=Path, required=True, help="the other tree")
    parser.add_argument("--servers", default="uvicorn,hypercorn")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--duration", type=float, default=3.0)
    parser.add_argument("-c", "--concurrency", type=int, default=32)
    parser.add_argument("--work", type=Path, default=Path("/tmp/lantern-bench-ab"))
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    args = parser.parse_args(argv)
    factory = ModelFactory(args.work)
    variant = _w("tiny", 2, BATCH, DELAY_MS)
    archive = factory.archive(variant)
    body, ctype = factory.body("tiny")
    names = [f"{variant.name}={archive.name}"]
    results: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for server in args.servers.split(","):
        base_work, new_work = args.work / f"base-{server}", args.work / f"new-{server}"
        with BareServer(args.work, server) as bare:
            bare.start()
            base = _start(args.base.resolve(), base_work, factory.store, names, server)
            new = _start(REPO, new_work, factory.store, names, server)
            try:
                targets = {
                    "bare": (bare.pid, bare.url),
                    "base": (base.pid, base.url(variant.name)),
                    "new": (new.pid, new.url(variant.name)),
                }
                for pid, url in targets.values():  # warm-up
                    _measure(pid, url, body, ctype, args.concurrency, 1.0)
                runs = results.setdefault(server, {k: [] for k in targets})
                for rnd in range(args.rounds):
                    order = list(targets) if rnd % 2 == 0 else list(targets)[::-1]
                    for key in order:
                        pid, url = targets[key]
                        sample = _measure(pid, url, body, ctype, args.concurrency, args.duration)
                        runs[key].append(sample)
                        print(f"[ab] {server} {key} round {rnd + 1}: {sample}", file=sys.stderr)
            finally:
                base.stop()
                new.stop()
    print(
        "server     bare fe ms  base fe ms  new fe ms  new/base  base-bare  new-bare  "
        "worker ms b/n  req/s b/n"
    )
    summary = {}
    for server, runs in results.items():
        med = {k: statistics.median(s["fe_ms"] for s in v) for k, v in runs.items()}
        rps = {k: statistics.median(s["rps"] for s in v) for k, v in runs.items()}
        wk = {k: statistics.median(s["worker_ms"] for s in v) for k, v in runs.items()}
        summary[server] = {"fe_ms": med, "rps": rps, "worker_ms": wk}
        print(
            f"{server:<10} {med['bare']:>10.3f}  {med['base']:>10.3f}  {med['new']:>9.3f}"
            f"  {med['new'] / med['base']:>8.3f}  {med['base'] - med['bare']:>9.3f}"
            f"  {med['new'] - med['bare']:>8.3f}  {wk['base']:.3f}/{wk['new']:.3f}"
            f"  {rps['base']:,.0f}/{rps['new']:,.0f}"
        )
    print(
        f"\ntiny, 2 workers, batch {BATCH} / {DELAY_MS} ms, c={args.concurrency}; "
        f"{args.rounds} rounds × {args.duration:g} s, alternating; medians. "
        f"Load average now {os.getloadavg()[0]:.2f}."
    )
    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out / f"ab-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps({"summary": summary, "runs": results}, indent=1))
    print(f"JSON: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
