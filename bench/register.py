"""``python -m bench.register``: register → READY and scale-up 1 → 3, with and without spares.

Each tree (``--base DIR`` first, then this one) serves with ``worker_spares`` 0 and 1, on a quiet
machine and with ``--hogs`` CPU hogs (``while 1: pass``, stopped by pid). Each repeat, on an idle
server (its spare, if any, ready: the harness waits for the log line):
``POST /models?url=torchscript.mar&initial_workers=1&synchronous=true`` (the tiny TorchScript
MLP, timed by the client, archive extraction included), then ``PUT /models/tiny?min_worker=3&
synchronous=true``, then ``DELETE``. Prints one table, medians and ranges in seconds.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

from bench.hog import cpu_hogs
from bench.recovery import _request, build_models, logged_ready, server_log
from bench.server import LanternProcess


def _log(message: str) -> None:
    print(f"[register {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def idle_spares(lantern: LanternProcess) -> int:
    """Spares logged ready and not (yet) logged taken."""
    return len(logged_ready(lantern)) - server_log(lantern).count("started from a warm spare")


def wait_idle(lantern: LanternProcess, spares: int, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while spares and idle_spares(lantern) < 1:
        if time.monotonic() > deadline:
            _log("no idle spare after 120 s; going on")
            return
        time.sleep(0.05)


def one_round(lantern: LanternProcess) -> tuple[float, float]:
    api = lantern.addresses["management"]
    started = time.perf_counter()
    query = "url=torchscript.mar&model_name=tiny&initial_workers=1&synchronous=true"
    status, body = _request("POST", f"{api}/models?{query}")
    register = time.perf_counter() - started
    if status != 200:
        raise RuntimeError(f"register: {status} {body[:300]!r}")
    started = time.perf_counter()
    status, body = _request("PUT", f"{api}/models/tiny?min_worker=3&synchronous=true")
    scale = time.perf_counter() - started
    if status not in (200, 202):
        raise RuntimeError(f"scale: {status} {body[:300]!r}")
    _request("DELETE", f"{api}/models/tiny")
    return register, scale


def serve(tree: Path | None, work: Path, store: Path, server: str, spares: int) -> LanternProcess:
    os.environ["LANTERN_WORKER_SPARES"] = str(spares)
    lantern = LanternProcess(work, store, ["onnx=onnx.mar"], server, ["--enable-model-api"])
    saved = os.environ.get("PYTHONPATH")
    if tree is not None:
        lantern.cwd = tree.resolve()
        os.environ["PYTHONPATH"] = str(lantern.cwd)
    try:
        return lantern.start()
    finally:
        if saved is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved


def _cell(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--hogs", type=int, default=2, help="CPU hogs for the loaded rows")
    parser.add_argument("--server", default="uvicorn")
    parser.add_argument("--base", type=Path, help="another tree, measured first")
    parser.add_argument("--work", type=Path, default=Path("/tmp/lantern-bench-register"))
    args = parser.parse_args(argv)
    store = build_models(Path("/tmp/lantern-bench-recovery"))
    rows = []
    trees = ([("base", args.base)] if args.base else []) + [("this", None)]
    for name, tree in trees:
        for spares in (0, 1):
            lantern = serve(tree, args.work / f"{name}-s{spares}", store, args.server, spares)
            try:
                for hogs in (0, args.hogs):
                    with cpu_hogs(hogs):
                        reg, scale, loads = [], [], []
                        for _ in range(args.repeats):
                            wait_idle(lantern, spares)
                            r, s = one_round(lantern)
                            reg.append(r)
                            scale.append(s)
                            loads.append(os.getloadavg()[0])
                            _log(f"{name} spares={spares} hogs={hogs}: {r:.2f} s, {s:.2f} s")
                    rows.append((name, spares, hogs, reg, scale, statistics.mean(loads)))
            finally:
                lantern.stop()
    print("tree  spares  hogs  register->READY s      scale 1->3 s           load avg")
    for name, spares, hogs, reg, scale, load in rows:
        print(f"{name:<5} {spares:>6} {hogs:>5}  {_cell(reg):<22} {_cell(scale):<22} {load:.2f}")
    print(f"\n{args.server}; {args.repeats} repeats; medians (min-max)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
