"""``python -m bench.multimodel``: four models on one server under mixed load, against one alone.

Four copies of the tiny TorchScript model (one worker each, unbatched) are driven at the same time
by four wrk processes with different concurrencies (8, 4, 2, 1: a busy model, a quiet one and two
in between); the baseline is one copy alone on its own server (all cores to its one worker) at
the same total concurrency (15). Two four-model servers run side by side with it:

* ``budget``: Lantern's default, the server-wide thread budget (`serve.core.threads`): four workers
  on two cores get one intra-op thread each;
* ``per-model``: every model's ``numThreads`` set to the cores, which is what dividing the cores
  among one model's own workers gave before the budget: four workers × two threads on two cores.

Reported per server: the sum of the four models' throughput over the lone model's (the bar: at
least 1), each model's throughput, and the least-served model's throughput over the mean of the
four (starvation: near 0; 1 is an even split, whatever each model's number of clients). Rounds
alternate between the lone and the mixed load.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import yaml

from archiver import build
from bench.load import run_load
from bench.models import ModelFactory
from bench.server import LanternProcess
from serve.core.threads import usable_cores

REPO = Path(__file__).resolve().parent.parent
MIX = {"m1": 8, "m2": 4, "m3": 2, "m4": 1}
SOLO = "m0"


def build_models(work: Path, setup: str, cores: int) -> Path:
    store = work / f"store-{setup}"
    store.mkdir(parents=True, exist_ok=True)
    weights = ModelFactory(work).weights("tiny")
    config: dict[str, Any] = {"minWorkers": 1, "maxWorkers": 1, "jobQueueSize": 1000}
    if setup == "per-model":
        config["numThreads"] = cores
    config_file = work / f"config-{setup}.yaml"
    config_file.write_text(yaml.safe_dump(config))
    for name in [SOLO] if setup == "solo" else list(MIX):
        if not (store / name).exists():
            build(
                model_name=name,
                version="1.0",
                handler="base_handler",
                serialized_file=str(weights),
                export_path=str(store),
                archive_format="no-archive",
                config_file=str(config_file),
            )
    return store


def drive(lantern: LanternProcess, load: dict[str, int], body: Path, seconds: float) -> dict:
    """Run one wrk per model at once; requests per second each."""
    out: dict[str, float] = {}

    def one(model: str, clients: int) -> None:
        result = run_load(
            lantern.url(model), body, "application/json", concurrency=clients, seconds=seconds
        )
        out[model] = result.rps if result.errors == 0 else 0.0

    threads = [threading.Thread(target=one, args=item) for item in load.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--server", default="uvicorn")
    parser.add_argument("--work", type=Path, default=Path("/tmp/lantern-bench-multimodel"))
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    args = parser.parse_args(argv)
    cores = usable_cores()
    body, _ = ModelFactory(args.work).body("tiny")
    os.environ["LANTERN_WORKER_SPARES"] = "0"  # nothing else on the cores
    servers: dict[str, LanternProcess] = {}
    samples: dict[str, dict[str, list[Any]]] = {}
    try:
        for setup in ("solo", "budget", "per-model"):
            store = build_models(args.work, setup, cores)
            names = [f"{n}={n}" for n in ([SOLO] if setup == "solo" else MIX)]
            servers[setup] = LanternProcess(args.work / setup, store, names, args.server).start()
        solos: list[float] = []
        for rnd in range(args.rounds):
            solo = drive(servers["solo"], {SOLO: sum(MIX.values())}, body, args.duration)[SOLO]
            solos.append(solo)
            for setup in ("budget", "per-model"):
                mixed = drive(servers[setup], MIX, body, args.duration)
                samples.setdefault(setup, {"mixed": []})["mixed"].append(mixed)
                print(
                    f"[multimodel] round {rnd + 1}: solo {solo:.0f}, {setup} {mixed}",
                    file=sys.stderr,
                    flush=True,
                )
    finally:
        for lantern in servers.values():
            lantern.stop()
    summary = {}
    print("setup      solo req/s  4-model sum  sum/solo  req/s m1..m4 (c=8,4,2,1)    least/mean")
    solo = statistics.median(solos)
    for setup, slot in samples.items():
        per_model = {m: statistics.median(s[m] for s in slot["mixed"]) for m in MIX}
        total = sum(per_model.values())
        mean = total / len(MIX)
        least = min(per_model.values()) / mean if mean else 0.0
        summary[setup] = {"solo": solo, "per_model": per_model, "sum_over_solo": total / solo}
        rates = " ".join(f"{per_model[m]:>6.0f}" for m in MIX)
        print(
            f"{setup:<10} {solo:>10.0f}  {total:>11.0f}  {total / solo:>8.2f}  {rates}  "
            f"{least:>10.2f}"
        )
    print(
        f"\ntiny TorchScript, 1 worker per model, unbatched, {cores} cores; clients {MIX} vs "
        f"{sum(MIX.values())} on one model; {args.rounds} rounds × {args.duration:g} s, medians; "
        f"load average now {os.getloadavg()[0]:.2f}"
    )
    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out / f"multimodel-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps({"summary": summary, "samples": samples}, indent=1))
    print(f"JSON: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
