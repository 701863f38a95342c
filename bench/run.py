"""``python -m bench``: build the models, run the plan, print one table, write JSON.

Order of work: for each HTTP server and model, one Lantern process holding every variant of that
model (the bare ASGI server of the same kind runs beside the tiny model's group). Every scenario
is warmed up once, then the repeats run round-robin: each round runs the model's raw baselines
(the servers sit idle meanwhile), then every ceiling and served scenario of the group. Ratios are
thus taken between figures measured minutes apart at most, and slow drift of a shared machine
spreads over all scenarios instead of biasing one; each figure is the median of its repeats
(raw baselines pool their samples from every server's group).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from bench import procstat
from bench.load import available_generator, run_load
from bench.models import ModelFactory, Variant
from bench.plan import MODELS, SERVERS, Ceiling, Plan, Raw, Served, build_plan
from bench.raw import run_raw
from bench.report import evaluate_bar, format_bar, format_table
from bench.server import BareServer, LanternProcess, batch_sizes

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"


def _log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


class Runner:
    """Executes a `Plan`, collecting every sample under its scenario key."""

    def __init__(self, plan: Plan, factory: ModelFactory, generator: str, work: Path) -> None:
        self.plan = plan
        self.factory = factory
        self.generator = generator
        self.work = work
        self.samples: dict[str, list[dict[str, Any]]] = {}
        self.scenarios: dict[str, dict[str, Any]] = {}
        self.server_headers: dict[str, str] = {}  # kind -> the Server header Lantern sent

    def _add(self, key: str, info: dict[str, Any], sample: dict[str, Any]) -> None:
        self.scenarios.setdefault(key, info)
        self.samples.setdefault(key, []).append(sample)

    # ----- raw -----------------------------------------------------------------------------

    def run_raw(self, raws: list[Raw], rep: int) -> None:
        for raw in raws:
            _log(f"{raw.key} (repeat {rep + 1}/{self.plan.repeats})")
            self._add(raw.key, _raw_info(raw), self._measure_raw(raw))

    def run_lone_raw(self) -> None:
        """Raw baselines of models no server group runs (e.g. ``--servers`` left them out)."""
        grouped = {model for _, model, _, _ in self.plan.groups()}
        lone = [r for r in self.plan.raw if r.model not in grouped]
        for rep in range(self.plan.repeats if lone else 0):
            self.run_raw(lone, rep)

    def _measure_raw(self, raw: Raw) -> dict[str, Any]:
        variant = Variant(raw.model, raw.processes, raw.threads)
        body, content_type = self.factory.body(raw.model)
        result = run_raw(
            self.factory.archive(variant),
            body,
            content_type,
            processes=raw.processes,
            threads=raw.threads,
            batch=raw.batch,
            seconds=self.plan.duration,
            warmup=self.plan.warmup,
        )
        return {
            "rps": result["items_per_s"],
            "requests": result["items"],
            "p50_ms": result["batch_p50_ms"],
            "cpu_ms_per_req": result["cpu_ms_per_item"],
            "errors": 0,
        }

    # ----- servers -------------------------------------------------------------------------

    def run_groups(self) -> None:
        for server, model, served, ceilings in self.plan.groups():
            label = f"{server}/{model or 'bare'}"
            bare = lantern = None
            try:
                if ceilings:
                    bare = BareServer(self.work, server).start()
                if served:
                    variants = list(dict.fromkeys(s.variant for s in served))
                    names = [f"{v.name}={self.factory.archive(v).name}" for v in variants]
                    _log(f"{label}: starting Lantern with {len(variants)} model variant(s)")
                    lantern = LanternProcess(self.work, self.factory.store, names, server).start()
                    self.server_headers[server] = lantern.server_header
                steps: list[Ceiling | Served] = [*ceilings, *served]
                for step in steps:  # warm-up: first TorchScript runs, connections, caches
                    self._load(step, bare, lantern, self.plan.warmup)
                raws = [r for r in self.plan.raw if r.model == model and r.key not in self.samples]
                if self.plan.raw_in_every_group:
                    raws = [r for r in self.plan.raw if r.model == model]
                for rep in range(self.plan.repeats):
                    self.run_raw(raws, rep)
                    for step in steps:
                        _log(f"{step.key} (repeat {rep + 1}/{self.plan.repeats})")
                        if isinstance(step, Ceiling):
                            assert bare is not None
                            self._add(step.key, _ceiling_info(step), self._ceiling(step, bare))
                        else:
                            assert lantern is not None
                            self._add(step.key, _served_info(step), self._served(step, lantern))
            finally:
                for proc in (lantern, bare):
                    if proc is not None:
                        proc.stop()

    def _load(
        self,
        step: Ceiling | Served,
        bare: BareServer | None,
        lantern: LanternProcess | None,
        seconds: float,
    ) -> Any:
        if isinstance(step, Ceiling):
            assert bare is not None
            body, content_type = self.factory.body("tiny")
            url = bare.url
        else:
            assert lantern is not None
            body, content_type = self.factory.body(step.variant.model)
            url = lantern.url(step.variant.name)
        return run_load(
            url,
            body,
            content_type,
            concurrency=step.concurrency,
            seconds=seconds,
            generator=self.generator,
        )

    def _ceiling(self, step: Ceiling, bare: BareServer) -> dict[str, Any]:
        before = procstat.cpu_seconds(bare.pid) or 0.0
        load = self._load(step, bare, None, self.plan.duration)
        cpu = (procstat.cpu_seconds(bare.pid) or 0.0) - before
        return {
            **load.as_dict(),
            "cpu_ms_per_req": _per_request(cpu, load.requests),
            "frontend_cpu_ms_per_req": _per_request(cpu, load.requests),
            "frontend_rss_mb": (procstat.rss_bytes(bare.pid) or 0) / 2**20,
        }

    def _served(self, step: Served, lantern: LanternProcess) -> dict[str, Any]:
        """Throughput and CPU from a steady-state window inside a longer load run.

        Counting wrk's completions over its whole run would charge the pipeline's fill at the
        start and lose the requests in flight at the end: with ResNet at c=16 (8-item batches
        of ~0.4 s) that is up to one batch round in thirteen. So the load runs ``ramp`` seconds
        longer on each side, and requests per second and CPU per request come from the server:
        the items its workers finished (the ``serve_batch_size`` sum) between two reads.
        """
        name = step.variant.name
        slow = step.variant.model != "tiny"
        seconds = self.plan.duration * (self.plan.slow_factor if slow else 1.0)
        ramp = min(1.0, seconds / 4)
        done: dict[str, Any] = {}

        def drive() -> None:
            try:
                done["load"] = self._load(step, None, lantern, ramp + seconds + ramp)
            except BaseException as exc:  # re-raised below, in the harness's own thread
                done["error"] = exc

        loader = threading.Thread(target=drive)
        loader.start()
        time.sleep(ramp)
        hist0 = lantern.batch_histogram(name)
        front0 = procstat.cpu_seconds(lantern.pid) or 0.0
        workers0 = procstat.cpu_snapshot(lantern.worker_pids())
        started = time.perf_counter()
        time.sleep(seconds)
        hist1 = lantern.batch_histogram(name)
        elapsed = time.perf_counter() - started
        workers1 = procstat.cpu_snapshot(lantern.worker_pids())
        front = (procstat.cpu_seconds(lantern.pid) or 0.0) - front0
        loader.join()
        if "error" in done:
            raise done["error"]
        load = done["load"]
        workers = procstat.cpu_delta(workers0, workers1)
        items = int(round(hist1.get("sum", 0.0) - hist0.get("sum", 0.0)))
        return {
            **load.as_dict(),
            "client_rps": load.rps,  # wrk's own count over its whole run
            "rps": items / elapsed if elapsed else 0.0,
            "window_s": round(elapsed, 3),
            "window_requests": items,
            "cpu_ms_per_req": _per_request(front + workers, items),
            "frontend_cpu_ms_per_req": _per_request(front, items),
            "worker_cpu_ms_per_req": _per_request(workers, items),
            "frontend_rss_mb": (procstat.rss_bytes(lantern.pid) or 0) / 2**20,
            "batch": batch_sizes(hist0, hist1),
        }


def _per_request(cpu: float, requests: int) -> float | None:
    return cpu / requests * 1000 if requests else None


def _raw_info(raw: Raw) -> dict[str, Any]:
    return {
        "kind": "raw",
        "model": raw.model,
        "server": "-",
        "workers": raw.processes,
        "threads": raw.threads,
        "batching": f"batch {raw.batch}",
        "batch_size": raw.batch,
        "concurrency": None,
    }


def _ceiling_info(step: Ceiling) -> dict[str, Any]:
    return {
        "kind": "ceiling",
        "model": "bare ASGI",
        "server": step.server,
        "workers": None,
        "threads": None,
        "batching": "-",
        "concurrency": step.concurrency,
    }


def _served_info(step: Served) -> dict[str, Any]:
    v = step.variant
    return {
        "kind": "served",
        "model": v.model,
        "variant": v.name,
        "server": step.server,
        "workers": v.workers,
        "threads": v.threads,
        "batching": v.batching,
        "batch_size": v.batch_size,
        "max_batch_delay_ms": v.max_batch_delay,
        "concurrency": step.concurrency,
    }


_MEDIAN_FIELDS = (
    "rps",
    "p50_ms",
    "p90_ms",
    "p99_ms",
    "mean_ms",
    "cpu_ms_per_req",
    "frontend_cpu_ms_per_req",
    "worker_cpu_ms_per_req",
    "frontend_rss_mb",
    "generator_cpu_s",
)


def summarise(runner: Runner) -> list[dict[str, Any]]:
    """One row per scenario: medians of its repeats, summed errors, the median run's batches."""
    rows = []
    for key, samples in runner.samples.items():
        row: dict[str, Any] = {"key": key, **runner.scenarios[key], "repeats": len(samples)}
        for field in _MEDIAN_FIELDS:
            values = [s[field] for s in samples if s.get(field) is not None]
            row[field] = statistics.median(values) if values else None
        row["errors"] = sum(int(s.get("errors") or 0) for s in samples)
        row["requests"] = sum(int(s.get("requests") or 0) for s in samples)
        by_rate = sorted(samples, key=lambda s: s["rps"])
        if "batch" in by_rate[0]:
            row["batch"] = by_rate[len(by_rate) // 2]["batch"]
        row["samples"] = samples
        rows.append(row)
    return sorted(rows, key=_order)


def _order(row: dict[str, Any]) -> tuple[Any, ...]:
    """Raw baselines, then per server its ceilings and served runs, by model, workers, batching."""
    model = MODELS.index(row["model"]) if row["model"] in MODELS else -1
    return (
        row["kind"] != "raw",
        row.get("server") or "",
        row["kind"] != "ceiling",
        model,
        row.get("workers") or 0,
        row.get("batch_size") or 0,
        row.get("max_batch_delay_ms") or 0,
        row.get("concurrency") or 0,
        row.get("threads") or 0,
    )


def _charts(data: dict[str, Any], path: Path) -> None:
    """The run's charts beside its JSON (bench/plots.py), when matplotlib is installed."""
    from bench.plots import write_charts

    try:
        written = write_charts(data, path.parent, path.stem)
    except ImportError:
        print("charts: pip install matplotlib to draw them")
        return
    for chart in written:
        print(f"chart: {chart}")


def _git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=10,
        )
    except OSError:
        return None
    return out.stdout.strip() or None


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="a short pass (under ~3 minutes)")
    mode.add_argument("--smoke", action="store_true", help="the smallest run (seconds; for tests)")
    parser.add_argument("--models", help=f"comma-separated, of {', '.join(MODELS)}")
    parser.add_argument("--servers", help="comma-separated: hypercorn, uvicorn")
    parser.add_argument("--duration", type=float, help="seconds per measured run")
    parser.add_argument("--repeats", type=int, help="measured runs per scenario (median kept)")
    parser.add_argument("--warmup", type=float, help="seconds of unmeasured load per scenario")
    parser.add_argument(
        "--generator",
        choices=["auto", "wrk", "python"],
        default="auto",
        help="load generator (auto: wrk when installed)",
    )
    parser.add_argument("--no-raw", action="store_true", help="skip the raw baselines")
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder for the JSON results")
    parser.add_argument("--work", type=Path, help="folder for built models and server logs")
    return parser.parse_args(argv)


def _servers(requested: str | None) -> list[str]:
    servers = [s.strip() for s in requested.split(",")] if requested else list(SERVERS)
    unknown = set(servers) - set(SERVERS)
    if unknown:
        raise SystemExit(f"unknown server(s): {', '.join(sorted(unknown))}")
    if "uvicorn" in servers:
        try:
            import uvicorn  # noqa: F401
        except ImportError:
            _log("uvicorn is not installed (pip install 'lantern-serve[uvicorn]'): skipping it")
            servers.remove("uvicorn")
    return servers


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    mode = "smoke" if args.smoke else "quick" if args.quick else "full"
    default_models = {"smoke": ["tiny"], "quick": ["tiny", "resnet18"], "full": list(MODELS)}
    wanted = [m.strip() for m in args.models.split(",")] if args.models else default_models[mode]
    unknown = set(wanted) - set(MODELS)
    if unknown:
        raise SystemExit(f"unknown model(s): {', '.join(sorted(unknown))}")
    models = [m for m in MODELS if m in wanted]
    servers = _servers(args.servers)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    plan = build_plan(mode, models, servers, cores or 1)
    if args.duration is not None:
        plan.duration = args.duration
    if args.repeats is not None:
        plan.repeats = max(1, args.repeats)
    if args.warmup is not None:
        plan.warmup = args.warmup
    if args.no_raw:
        plan.raw = []
    generator = available_generator(args.generator)
    if generator == "python":
        _log(
            "wrk not found (Debian: apt-get install -y wrk): using bench.pyload, which costs "
            "the server more of the shared CPU per request"
        )
    work = args.work or args.out / "work"
    work.mkdir(parents=True, exist_ok=True)
    runner = Runner(plan, ModelFactory(work), generator, work)
    started = time.time()
    load_before = os.getloadavg()
    runner.run_lone_raw()
    runner.run_groups()
    rows = summarise(runner)
    bar = evaluate_bar(rows)
    meta = {
        "mode": mode,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
        "wall_s": round(time.time() - started, 1),
        "cores": cores,
        # Other work on the machine skews everything: the 1-minute load average before and after.
        "loadavg": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
        "python": platform.python_version(),
        "platform": platform.platform(),
        "commit": _git_commit(),
        "generator": generator,
        "duration_s": plan.duration,
        "repeats": plan.repeats,
        "warmup_s": plan.warmup,
        "models": models,
        "servers": servers,
        "server_headers": runner.server_headers,
    }
    print(format_table(rows, meta))
    if bar:
        print()
        print(format_bar(bar))
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"bench-{mode}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps({"meta": meta, "results": rows, "bar": bar}, indent=1))
    print(f"\nJSON: {path}")
    _charts({"meta": meta, "results": rows}, path)
    return 0
