"""``python -m bench.scaleup``: latency while a model scales from 1 to 4 workers under load.

The tiny TorchScript MLP, unbatched, one worker, driven by the Python load generator at c=4 (it
records when each request was sent). Four seconds into the run, ``PUT /models/NAME?min_worker=4``;
the harness polls ``GET /models/NAME`` until four workers are READY. Each request falls in one
window by its send time: *before* (from 1 s after the start to the PUT), *during* (from the PUT
until all four are READY, plus 0.5 s), *after* (the rest). Issue 18's goal: p99 during ≤ 2 × p99
before.

Several server setups run side by side, one trial of each in turn (alternating, so the machine's
drift hits them alike), each trial starting from one READY worker and a ready spare:

* ``before``: the archive has no warm-up samples, workers start at normal priority;
* ``warmup``: the archive carries a warm-up sample (``model-config.yaml``'s ``warmup`` list);
* ``now``: warm-up samples and the default start priority (``worker_start_nice``);
* ``now-nospare``: as ``now`` with ``worker_spares: 0``;
* ``base``: the ``--base`` tree's code (e.g. a checkout of the commit before a change) serving
  the archive with warm-up samples, with its own defaults.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from archiver import build
from bench.models import ModelFactory
from bench.pyload import percentile
from bench.recovery import _request, logged_ready, ready_pids, wait_new_spare
from bench.server import LanternProcess

REPO = Path(__file__).resolve().parent.parent
MODEL = "tiny"
BEFORE_S = 4.0
AFTER_S = 3.0
SETUPS: dict[str, dict[str, Any]] = {
    "before": {"warmup": False, "nice": 0, "spares": 1},
    "warmup": {"warmup": True, "nice": 0, "spares": 1},
    "now": {"warmup": True, "nice": None, "spares": 1},
    "now-nospare": {"warmup": True, "nice": None, "spares": 0},
    "base": {"warmup": True, "nice": None, "spares": 1},
}


def _log(message: str) -> None:
    print(f"[scaleup {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def build_archives(work: Path) -> tuple[Path, Path]:
    """The store (``tiny_cold``, ``tiny_warm`` folder archives) and the request body."""
    factory = ModelFactory(work)
    body, _ = factory.body(MODEL)
    store = work / "store"
    store.mkdir(parents=True, exist_ok=True)
    sample = json.loads(body.read_text())
    for name, warm in (("tiny_cold", False), ("tiny_warm", True)):
        if (store / name / "MAR-INF" / "MANIFEST.json").is_file():
            continue
        config: dict[str, Any] = {"minWorkers": 1, "maxWorkers": 4, "batchSize": 1}
        if warm:
            config["warmup"] = [{"body": sample, "contentType": "application/json"}]
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "model-config.yaml"
            path.write_text(yaml.safe_dump(config))
            build(
                model_name=name,
                version="1.0",
                handler="base_handler",
                serialized_file=str(factory.weights(MODEL)),
                export_path=str(store),
                archive_format="no-archive",
                force=True,
                config_file=str(path),
            )
    return store, body


@dataclass
class Trial:
    setup: str
    p50: dict[str, float] = field(default_factory=dict)
    p99: dict[str, float] = field(default_factory=dict)
    max: dict[str, float] = field(default_factory=dict)
    count: dict[str, int] = field(default_factory=dict)
    to_ready_s: float | None = None
    errors: int = 0
    worst_window_p99: float = float("nan")  # the highest p99 of any 1 s window during scale-up
    ready_at: list[float] = field(default_factory=list)  # each new worker's READY, s after PUT

    @property
    def ratio(self) -> float:
        return self.p99["during"] / self.p99["before"] if self.p99.get("before") else float("nan")

    @property
    def spike(self) -> float:
        """p99 during over the higher of the two steady states around it: above 1 only where the
        scale-up itself costs latency, not the new number of workers (on a small machine four
        workers may serve with a higher p99 than one)."""
        steady = max(self.p99.get("before", 0.0), self.p99.get("after", 0.0))
        return self.p99["during"] / steady if steady else float("nan")


def _percentile(ordered: list[float], pct: float) -> float:
    """`bench.pyload.percentile`, but NaN for an empty window (0.0 would read as a figure)."""
    return percentile(ordered, pct) if ordered else float("nan")


def windows(
    timeline: list[tuple[float, float]], start: float, put: float, ready: float | None
) -> dict[str, list[float]]:
    """Latencies (ms) per window, by each request's send time."""
    end_during = (ready if ready is not None else float("inf")) + 0.5
    out: dict[str, list[float]] = {"before": [], "during": [], "after": []}
    for sent, latency in timeline:
        if sent < start + 1.0:
            continue
        key = "before" if sent < put else "during" if sent <= end_during else "after"
        out[key].append(latency * 1000)
    return out


def worst_window(
    timeline: list[tuple[float, float]], put: float, ready: float | None, width: float = 1.0
) -> float:
    """The highest p99 (ms) over ``width``-second windows, sliding by a tenth of that, between the
    PUT and 0.5 s after the last worker's READY: a short spike that a p99 over the whole scale-up
    would dilute."""
    end = (ready if ready is not None else max(t for t, _ in timeline)) + 0.5
    worst = float("nan")
    left = put
    while left < end:
        inside = sorted(lat * 1000 for t, lat in timeline if left <= t < min(left + width, end))
        if len(inside) >= 20:
            value = _percentile(inside, 99)
            worst = value if worst != worst else max(worst, value)
        left += width / 10
    return worst


def _poll_ready(
    lantern: LanternProcess,
    model: str,
    workers: int,
    seen: dict[int, float],
    done: threading.Event,
    end: float,
) -> None:
    """Until ``end``: each READY worker's pid when first seen (and -1: when ``workers`` were)."""
    while time.monotonic() < end:
        pids = ready_pids(lantern, model)
        for pid in pids:
            seen.setdefault(pid, time.monotonic())
        if len(pids) >= workers and not done.is_set():
            seen[-1] = time.monotonic()
            done.set()
        time.sleep(0.05)


def trial(
    lantern: LanternProcess,
    setup: str,
    model: str,
    body: Path,
    spares: int,
    workers: int = 4,
    dump: Path | None = None,
) -> Trial:
    api = lantern.addresses["management"]
    status, text = _request("PUT", f"{api}/models/{model}?min_worker=1&synchronous=true")
    if status != 200:
        raise RuntimeError(f"scale down: {status} {text[:200]!r}")
    while len(ready_pids(lantern, model)) != 1:
        time.sleep(0.1)
    wait_new_spare(lantern, set(), spares)
    with tempfile.TemporaryDirectory() as tmp:
        timeline_file = Path(tmp) / "timeline.json"
        seconds = BEFORE_S + 25 + AFTER_S
        env = dict(os.environ, BENCH_BODY=str(body), BENCH_CONTENT_TYPE="application/json")
        gen = subprocess.Popen(
            [sys.executable, "-m", "bench.pyload", lantern.url(model), "-c", "4", "-d",
             str(seconds), "--timeline", str(timeline_file)],
            env=env, cwd=REPO, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        start = time.monotonic()
        # The describe polls run through the whole run, so that every window carries their cost.
        seen: dict[int, float] = {}
        all_ready = threading.Event()
        put = start + BEFORE_S
        poller = threading.Thread(
            target=_poll_ready, args=(lantern, model, workers, seen, all_ready, start + seconds)
        )
        poller.start()
        time.sleep(max(0.0, put - time.monotonic()))
        spares_before = logged_ready(lantern)
        put = time.monotonic()
        threading.Thread(
            target=_request,
            args=("PUT", f"{api}/models/{model}?min_worker={workers}&synchronous=false"),
        ).start()
        all_ready.wait(timeout=seconds - BEFORE_S - AFTER_S)
        ready = seen.get(-1) if all_ready.is_set() else None
        poller.join()
        seen.pop(-1, None)
        seen = {pid: at - put for pid, at in seen.items()}
        out, _ = gen.communicate(timeout=seconds + 60)
        summary = json.loads(
            next(ln for ln in out.splitlines() if ln.startswith("BENCH_JSON "))[11:]
        )
        timeline = json.loads(timeline_file.read_text())
    # The scale-up took the spare: the next trial starts once its replacement is ready, so that
    # no spare's import falls into that trial's "before".
    wait_new_spare(lantern, spares_before, spares)
    result = Trial(setup, to_ready_s=None if ready is None else ready - put)
    result.ready_at = sorted(v for v in seen.values() if v > 0)
    result.worst_window_p99 = worst_window(timeline, put, ready)
    if dump is not None:
        dump.mkdir(parents=True, exist_ok=True)
        (dump / f"{setup}-{time.strftime('%H%M%S')}.json").write_text(
            json.dumps({"start": start, "put": put, "ready": ready, "seen": seen, "t": timeline})
        )
    result.errors = sum(int(summary[k]) for k in ("connect", "read", "write", "status", "timeout"))
    for key, values in windows(timeline, start, put, ready).items():
        ordered = sorted(values)
        result.p50[key] = _percentile(ordered, 50)
        result.p99[key] = _percentile(ordered, 99)
        result.max[key] = ordered[-1] if ordered else float("nan")
        result.count[key] = len(ordered)
    return result


def report(trials: list[Trial], setups: list[str]) -> None:
    """The table: one row per trial, then each setup's medians."""
    print(
        "setup        p99 before  during   after  during/before  during/steady  worst 1 s/before"
        "  max before  max during  4 READY s  errors"
    )
    for t in trials:
        ready = f"{t.to_ready_s:.2f}" if t.to_ready_s is not None else "not in run"
        print(
            f"{t.setup:<12} {t.p99['before']:>10.2f} {t.p99['during']:>7.2f} "
            f"{t.p99['after']:>7.2f} {t.ratio:>14.2f} {t.spike:>14.2f} "
            f"{t.worst_window_p99 / t.p99['before']:>17.2f} {t.max['before']:>11.2f} "
            f"{t.max['during']:>11.2f} {ready:>10} {t.errors:>7}"
        )
    for name in setups:
        mine = [t for t in trials if t.setup == name]
        ratio = statistics.median(t.ratio for t in mine)
        spike = statistics.median(t.spike for t in mine)
        worst = statistics.median(t.worst_window_p99 / t.p99["before"] for t in mine)
        print(
            f"{name}: median during/before {ratio:.2f}, during/steady {spike:.2f}, "
            f"worst 1 s window/before {worst:.2f} ({len(mine)} trials)"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=3, help="trials per setup")
    parser.add_argument("--setups", default=",".join(SETUPS), help="comma-separated")
    parser.add_argument("--server", default="uvicorn")
    parser.add_argument("--work", type=Path, default=Path("/tmp/lantern-bench-scaleup"))
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    parser.add_argument("--dump", type=Path, help="save each trial's timeline and events here")
    parser.add_argument("--base", type=Path, help="the other tree, for the 'base' setup")
    parser.add_argument("--workers", type=int, default=4, help="workers to scale to (from 1)")
    args = parser.parse_args(argv)
    store, body = build_archives(args.work)
    setups = [s for s in args.setups.split(",") if s]
    servers: dict[str, LanternProcess] = {}
    trials: list[Trial] = []
    try:
        for name in setups:
            setup = SETUPS[name]
            os.environ["LANTERN_WORKER_SPARES"] = str(setup["spares"])
            if setup["nice"] is None:
                os.environ.pop("LANTERN_WORKER_START_NICE", None)
            else:
                os.environ["LANTERN_WORKER_START_NICE"] = str(setup["nice"])
            model = "tiny_warm" if setup["warmup"] else "tiny_cold"
            _log(f"starting the {name!r} server")
            lantern = LanternProcess(
                args.work / name, store, [f"{model}={model}"], args.server, ["--enable-model-api"]
            )
            saved = os.environ.get("PYTHONPATH")
            if name == "base":  # that tree's root: the working folder and first on the path
                if args.base is None:
                    parser.error("the 'base' setup needs --base")
                lantern.cwd = args.base.resolve()
                os.environ["PYTHONPATH"] = str(lantern.cwd)
            try:
                servers[name] = lantern.start()
            finally:
                if saved is None:
                    os.environ.pop("PYTHONPATH", None)
                else:
                    os.environ["PYTHONPATH"] = saved
        for rep in range(args.trials):
            for name in setups:
                setup = SETUPS[name]
                model = "tiny_warm" if setup["warmup"] else "tiny_cold"
                result = trial(
                    servers[name], name, model, body, setup["spares"], args.workers, args.dump
                )
                trials.append(result)
                _log(
                    f"{name} #{rep + 1}: p99 {result.p99['before']:.2f} -> "
                    f"{result.p99['during']:.2f} ms ({result.ratio:.2f}x), 4 READY in "
                    f"{result.to_ready_s if result.to_ready_s is not None else float('nan'):.2f} s"
                )
    finally:
        for lantern in servers.values():
            lantern.stop()
    report(trials, setups)
    print(f"\n{args.server}; c=4, unbatched; load average now {os.getloadavg()[0]:.2f}")
    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out / f"scaleup-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps([t.__dict__ for t in trials], indent=1))
    print(f"JSON: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
