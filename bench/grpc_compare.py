"""``python -m bench.grpc_compare``: gRPC against HTTP on the tiny model, as ratios of one run.

For each HTTP server (hypercorn, uvicorn) one Lantern process serves the tiny model twice:
batched (batch 8, 5 ms delay) driven at c=32, and unbatched driven at c=1. Each round drives each
scenario over HTTP with ``wrk`` (when installed), over HTTP with the Python generator
(``bench.pyload``) and over gRPC with the Python gRPC generator (``bench.grpcload``, TorchServe's
``Predictions``); rounds alternate, and each figure is the median of its rounds. ``--loops`` adds
a Lantern on hypercorn with ``LANTERN_EVENT_LOOP=asyncio`` to measure gRPC without uvloop.

The machine is shared: absolute figures move run to run, so compare the ratios printed at the
end, taken from figures measured in the same rounds. Results go to ``bench/results``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench import procstat
from bench.load import LoadResult, available_generator, run_load
from bench.models import ModelFactory, Variant
from bench.plan import BATCH, DELAY_MS
from bench.server import LanternProcess

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
SCENARIOS = {
    "batched c=32": (Variant("tiny", 1, 1, BATCH, DELAY_MS), 32),
    "unbatched c=1": (Variant("tiny", 1, 1), 1),
}


def _log(message: str) -> None:
    print(f"[grpc-bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def run_grpc_load(
    target: str, model: str, body: Path, *, concurrency: int, seconds: float, processes: int
) -> LoadResult:
    """Like `run_load`, over gRPC with ``bench.grpcload``."""
    env = dict(os.environ, BENCH_BODY=str(body))
    cmd = [sys.executable, "-m", "bench.grpcload", target, model]
    cmd += ["-c", str(concurrency), "-d", str(seconds), "-p", str(processes)]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run(
        cmd, env=env, capture_output=True, text=True, timeout=seconds + 180, cwd=REPO
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("BENCH_JSON ")), None)
    if proc.returncode != 0 or line is None:
        raise RuntimeError(f"grpcload failed ({proc.returncode}): {proc.stderr[-3000:]}")
    data = json.loads(line.removeprefix("BENCH_JSON "))
    detail = {k: int(data[k]) for k in ("connect", "read", "write", "status", "timeout")}
    elapsed = data["duration_us"] / 1e6
    return LoadResult(
        requests=int(data["requests"]),
        seconds=round(elapsed, 3),
        rps=data["requests"] / elapsed if elapsed else 0.0,
        p50_ms=data["p50_us"] / 1000,
        p90_ms=data["p90_us"] / 1000,
        p99_ms=data["p99_us"] / 1000,
        mean_ms=data["mean_us"] / 1000,
        max_ms=data["max_us"] / 1000,
        errors=sum(detail.values()),
        error_detail=detail,
        generator=f"grpcload x{processes}",
        generator_cpu_s=round(cpu, 3),
    )


def _measure(
    lantern: LanternProcess,
    factory: ModelFactory,
    scenario: str,
    client: str,
    seconds: float,
    processes: int,
) -> LoadResult:
    variant, concurrency = SCENARIOS[scenario]
    body, content_type = factory.body("tiny")
    if client == "grpc":
        return run_grpc_load(
            lantern.addresses["grpc_inference"],
            variant.name,
            body,
            concurrency=concurrency,
            seconds=seconds,
            processes=min(processes, concurrency),
        )
    generator = "wrk" if client == "http-wrk" else "python"
    return run_load(
        lantern.url(variant.name),
        body,
        content_type,
        concurrency=concurrency,
        seconds=seconds,
        generator=generator,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", nargs="+", default=["hypercorn", "uvicorn"])
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--processes", type=int, default=2, help="gRPC generator processes")
    parser.add_argument("--loops", action="store_true", help="also gRPC without uvloop")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    clients = ["http-python", "grpc"]
    if available_generator() == "wrk":
        clients.insert(0, "http-wrk")
    work = Path(os.environ.get("BENCH_WORK", "/tmp/lantern-grpc-bench"))  # its own store
    factory = ModelFactory(work)
    names = [f"{v.name}={_archive(factory, v).name}" for v, _ in SCENARIOS.values()]
    groups: list[tuple[str, str, str | None]] = [(s, s, None) for s in args.servers]
    if args.loops:
        groups.append(("hypercorn+asyncio", "hypercorn", "asyncio"))
    samples: dict[tuple[str, str, str], list[LoadResult]] = {}
    frontend: dict[tuple[str, str, str], list[float]] = {}  # frontend CPU ms per request
    for label, server, loop in groups:
        _log(f"{label}: starting Lantern")
        lantern = _start(work / label, factory, names, server, loop)
        try:
            group_clients = ["grpc"] if loop else clients
            for scenario in SCENARIOS:
                for client in group_clients:  # warm-up
                    _measure(lantern, factory, scenario, client, 1.0, args.processes)
            for rep in range(args.repeats):
                for scenario in SCENARIOS:
                    for client in group_clients:
                        _log(f"{label} {scenario} {client} ({rep + 1}/{args.repeats})")
                        cpu0 = procstat.cpu_seconds(lantern.pid) or 0.0
                        result = _measure(
                            lantern, factory, scenario, client, args.duration, args.processes
                        )
                        cpu = (procstat.cpu_seconds(lantern.pid) or 0.0) - cpu0
                        frontend[(label, scenario, client)] = frontend.get(
                            (label, scenario, client), []
                        ) + [1000 * cpu / max(result.requests, 1)]
                        samples.setdefault((label, scenario, client), []).append(result)
        finally:
            lantern.stop()
    report = _report(samples, frontend)
    print(report["table"])
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"grpc-compare-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps({k: v for k, v in report.items() if k != "table"}, indent=2))
    print(f"JSON: {path}")


def _archive(factory: ModelFactory, variant: Variant) -> Path:
    """The tiny model behind ``tiny_json_handler.py`` (gRPC inputs arrive as JSON bytes)."""
    import tempfile

    import yaml

    from archiver import build

    target = factory.store / variant.name
    if (target / "MAR-INF" / "MANIFEST.json").is_file():
        return target
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "model-config.yaml"
        config.write_text(yaml.safe_dump(variant.model_config()))
        return build(
            model_name=variant.name,
            version="1.0",
            handler=str(Path(__file__).with_name("tiny_json_handler.py")),
            serialized_file=str(factory.weights("tiny")),
            export_path=str(factory.store),
            archive_format="no-archive",
            force=True,
            config_file=str(config),
        )


def _start(
    work: Path, factory: ModelFactory, names: list[str], server: str, loop: str | None
) -> LanternProcess:
    """Lantern on ``server``; ``loop`` sets ``LANTERN_EVENT_LOOP`` for that process only."""
    previous = os.environ.get("LANTERN_EVENT_LOOP")
    if loop:
        os.environ["LANTERN_EVENT_LOOP"] = loop
    try:
        return LanternProcess(work, factory.store, names, server).start()
    finally:
        if previous is None:
            os.environ.pop("LANTERN_EVENT_LOOP", None)
        else:
            os.environ["LANTERN_EVENT_LOOP"] = previous


def _report(
    samples: dict[tuple[str, str, str], list[LoadResult]],
    frontend: dict[tuple[str, str, str], list[float]],
) -> dict[str, Any]:
    rows = []
    medians: dict[tuple[str, str, str], dict[str, float]] = {}
    for key, results in samples.items():
        med = {
            "rps": statistics.median(r.rps for r in results),
            "p50_ms": statistics.median(r.p50_ms for r in results),
            "p99_ms": statistics.median(r.p99_ms for r in results),
            "errors": sum(r.errors for r in results),
            "frontend_cpu_ms_per_req": statistics.median(frontend[key]),
            "gen_cpu_ms_per_req": statistics.median(
                1000 * r.generator_cpu_s / max(r.requests, 1) for r in results
            ),
        }
        medians[key] = med
        rows.append({"server": key[0], "scenario": key[1], "client": key[2], **med})
    lines = [
        f"{'server':<18} {'scenario':<14} {'client':<12} {'req/s':>8} {'p50 ms':>8} "
        f"{'p99 ms':>8} {'err':>4} {'fe cpu ms/req':>14} {'gen cpu ms/req':>15}",
        "-" * 111,
    ]
    for row in rows:
        lines.append(
            f"{row['server']:<18} {row['scenario']:<14} {row['client']:<12} {row['rps']:>8.0f} "
            f"{row['p50_ms']:>8.2f} {row['p99_ms']:>8.2f} {row['errors']:>4} "
            f"{row['frontend_cpu_ms_per_req']:>14.3f} {row['gen_cpu_ms_per_req']:>15.3f}"
        )
    ratios = []
    lines += ["", "gRPC / HTTP throughput (same server process, same rounds):"]
    servers = dict.fromkeys(k[0] for k in medians)
    for scenario in SCENARIOS:
        http_best = max(
            (m["rps"] for k, m in medians.items() if k[1] == scenario and k[2].startswith("http")),
            default=0.0,
        )
        for server in servers:
            grpc_rps = medians.get((server, scenario, "grpc"), {}).get("rps")
            if grpc_rps is None:
                continue
            for client in ("http-wrk", "http-python"):
                http = medians.get((server, scenario, client))
                if http and http["rps"]:
                    ratio = grpc_rps / http["rps"]
                    ratios.append(
                        {"server": server, "scenario": scenario, "vs": client, "ratio": ratio}
                    )
                    lines.append(f"  {server:<18} {scenario:<14} vs {client:<12} {ratio:6.2f}x")
            if http_best:
                ratio = grpc_rps / http_best
                ratios.append(
                    {"server": server, "scenario": scenario, "vs": "fastest-http", "ratio": ratio}
                )
                lines.append(f"  {server:<18} {scenario:<14} vs fastest HTTP {ratio:6.2f}x")
    return {"rows": rows, "ratios": ratios, "table": "\n".join(lines)}


if __name__ == "__main__":
    main()
