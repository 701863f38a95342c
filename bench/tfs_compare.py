"""``python -m bench.tfs_compare``: TF Serving's gRPC ``Predict`` against Lantern's own paths.

One Lantern process serves one ONNX model (x FP32 [batch, 16] -> a 16x16 matmul, batch 8, 5 ms
delay). Each round drives the same input, one row per request, at ``-c`` concurrent calls over
TF Serving's gRPC ``Predict`` (``tensor_content``), the Open Inference Protocol's gRPC
``ModelInfer`` and KServe v1 / TF Serving REST ``:predict`` (``bench.load``); rounds alternate
and each figure is the median of its rounds. The machine is shared: compare the ratios, taken
from the same rounds. Results go to ``bench/results/tfs_compare.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.load import run_load
from bench.server import LanternProcess

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
WIDTH = 16


def _log(message: str) -> None:
    print(f"[tfs-bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def build(work: Path) -> tuple[Path, Path, Path]:
    """The model's archive store, the input row (.npy) and the REST body."""
    from onnx import TensorProto, helper, save

    from archiver import build as build_archive

    rng = np.random.default_rng(0)
    weights = rng.standard_normal((WIDTH, WIDTH)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "dense",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", WIDTH])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", WIDTH])],
        initializer=[helper.make_tensor("w", TensorProto.FLOAT, [WIDTH, WIDTH], weights.ravel())],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    store = work / "store"
    store.mkdir(parents=True, exist_ok=True)
    save(model, str(work / "dense.onnx"))
    config = work / "dense-config.yaml"
    config.write_text("batchSize: 8\nmaxBatchDelay: 5\nminWorkers: 1\nmaxWorkers: 1\n")
    build_archive(
        model_name="dense",
        version="1",
        handler="base_handler",
        serialized_file=str(work / "dense.onnx"),
        export_path=str(store),
        config_file=str(config),
        force=True,
    )
    row = rng.standard_normal((1, WIDTH)).astype(np.float32)
    np.save(work / "row.npy", row)
    body = work / "body.json"
    body.write_text(json.dumps({"instances": row.tolist()}))
    return store, work / "row.npy", body


def grpc_load(
    target: str, kind: str, tensor: Path, concurrency: int, seconds: float
) -> dict[str, Any]:
    env = dict(os.environ, BENCH_TENSOR=str(tensor), BENCH_INPUT="x")
    cmd = [sys.executable, "-m", "bench.grpcload", target, "dense", "--kind", kind]
    cmd += ["-c", str(concurrency), "-d", str(seconds), "-p", "1"]
    proc = subprocess.run(
        cmd, env=env, capture_output=True, text=True, timeout=seconds + 180, cwd=REPO
    )
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("BENCH_JSON ")), None)
    if proc.returncode != 0 or line is None:
        raise RuntimeError(f"grpcload failed ({proc.returncode}): {proc.stderr[-3000:]}")
    data = json.loads(line.removeprefix("BENCH_JSON "))
    elapsed = data["duration_us"] / 1e6
    errors = sum(int(data[k]) for k in ("connect", "read", "write", "status", "timeout"))
    return {
        "rps": data["requests"] / elapsed if elapsed else 0.0,
        "p50_ms": data["p50_us"] / 1000,
        "errors": errors,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-c", "--concurrency", type=int, default=16)
    parser.add_argument("-d", "--duration", type=float, default=5.0)
    parser.add_argument("-r", "--rounds", type=int, default=3)
    parser.add_argument("--work", type=Path, default=None, help="default: a temporary folder")
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="lantern-tfs-bench-"))
    store, row, body = build(work)
    server = LanternProcess(work, store, ["dense=dense.mar"], "uvicorn").start()
    figures: dict[str, list[dict[str, Any]]] = {"tfserving-grpc": [], "oip-grpc": [], "rest": []}
    try:
        grpc_target = server.addresses["grpc_inference"]
        url = f"{server.addresses['inference']}/v1/models/dense:predict"
        for round_ in range(args.rounds):
            for name in figures:
                if name == "rest":
                    result = run_load(
                        url,
                        body,
                        "application/json",
                        concurrency=args.concurrency,
                        seconds=args.duration,
                    )
                    figure = {"rps": result.rps, "p50_ms": result.p50_ms, "errors": result.errors}
                else:
                    kind = name.split("-")[0]
                    figure = grpc_load(grpc_target, kind, row, args.concurrency, args.duration)
                figures[name].append(figure)
                _log(f"round {round_ + 1} {name}: {figure['rps']:.0f} req/s")
    finally:
        server.stop()
    summary = {
        name: {
            "rps": statistics.median(f["rps"] for f in runs),
            "p50_ms": statistics.median(f["p50_ms"] for f in runs),
            "errors": sum(f["errors"] for f in runs),
        }
        for name, runs in figures.items()
    }
    base = summary["tfserving-grpc"]["rps"] or 1.0
    for name, figure in summary.items():
        figure["vs_tfserving_grpc"] = round(figure["rps"] / base, 3)
        print(
            f"{name:16s} {figure['rps']:8.0f} req/s  p50 {figure['p50_ms']:.2f} ms  "
            f"x{figure['vs_tfserving_grpc']:.2f}  errors {figure['errors']}"
        )
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = {"concurrency": args.concurrency, "duration_s": args.duration, "summary": summary}
    (RESULTS / "tfs_compare.json").write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
