"""``python -m bench.layouts``: what serving from a Triton / OVMS layout costs per request.

One server serves the same small ONNX model twice, from a Triton model folder (``config.pbtxt`` +
``1/model.onnx``) and as a ``.mar`` archive, and an OpenVINO IR of it; a closed loop of
``--clients`` threads sends OIP binary requests (``tritonclient.http``) to one at a time,
alternating for ``--rounds`` rounds; medians of req/s and p50 latency. The IR is also run
in-process with OpenVINO (the same batch), the ceiling the served numbers are read against.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.server import LanternProcess

CONFIG = """
max_batch_size: 8
input [ { name: "x" data_type: TYPE_FP32 dims: [ 64 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 16 ] } ]
dynamic_batching { max_queue_delay_microseconds: 2000 }
instance_group [ { count: 1 kind: KIND_CPU } ]
"""


def _onnx(path: Path) -> Path:
    """x FP32 [batch, 64] -> y = relu(x @ W) [batch, 16]."""
    from onnx import TensorProto, helper, save

    weights = np.random.default_rng(0).standard_normal((64, 16)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])],
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 16])],
        initializer=[helper.make_tensor("w", TensorProto.FLOAT, [64, 16], weights.ravel())],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    save(model, str(path))
    return path


def _store(root: Path) -> Path:
    import openvino as ov

    from archiver import build

    store = root / "store"
    (store / "triton" / "1").mkdir(parents=True)
    onnx = _onnx(store / "triton" / "1" / "model.onnx")
    (store / "triton" / "config.pbtxt").write_text(CONFIG)
    (store / "ir" / "1").mkdir(parents=True)
    (store / "ir" / "config.pbtxt").write_text(CONFIG)
    ov.save_model(ov.convert_model(str(onnx)), str(store / "ir" / "1" / "model.xml"))
    config = root / "mar.yaml"
    config.write_text("batchSize: 8\nmaxBatchDelay: 2\nminWorkers: 1\nmaxWorkers: 1\n")
    build(
        model_name="mar",
        version="1",
        handler="base_handler",
        serialized_file=str(onnx),
        export_path=str(store),
        config_file=str(config),
        force=True,
    )
    return store


def _drive(url: str, model: str, clients: int, seconds: float) -> tuple[float, float]:
    """Closed loop for ``seconds``: (requests per second, p50 latency in ms)."""
    import tritonclient.http as thttp

    latencies: list[float] = []
    lock = threading.Lock()
    stop = time.monotonic() + seconds
    x = np.random.default_rng(1).standard_normal((1, 64)).astype(np.float32)

    def loop() -> None:
        client = thttp.InferenceServerClient(url)
        entry = thttp.InferInput("x", [1, 64], "FP32")
        entry.set_data_from_numpy(x, binary_data=True)
        mine = []
        while time.monotonic() < stop:
            started = time.perf_counter()
            client.infer(model, [entry])
            mine.append(time.perf_counter() - started)
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=loop) for _ in range(clients)]
    began = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.monotonic() - began
    return len(latencies) / elapsed, statistics.median(latencies) * 1000


def _in_process(store: Path, seconds: float) -> tuple[float, float]:
    """The IR run by OpenVINO in this process, one row a call: (calls per second, p50 ms)."""
    import openvino as ov

    compiled = ov.Core().compile_model(str(store / "ir" / "1" / "model.xml"), "CPU")
    x = np.random.default_rng(1).standard_normal((1, 64)).astype(np.float32)
    times = []
    stop = time.monotonic() + seconds
    while time.monotonic() < stop:
        started = time.perf_counter()
        compiled({"x": x})
        times.append(time.perf_counter() - started)
    return len(times) / seconds, statistics.median(times) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--clients", type=int, default=8)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        store = _store(root)
        server = LanternProcess(root, store, ["triton", "mar=mar.mar", "ir"], "auto").start()
        url = server.addresses["inference"].removeprefix("http://")
        results: dict[str, list[tuple[float, float]]] = {"triton": [], "mar": [], "ir": []}
        try:
            for _ in range(args.rounds):
                for model in results:
                    results[model].append(_drive(url, model, args.clients, args.seconds))
        finally:
            server.stop()
        rows: list[tuple[str, Any, Any]] = []
        for model, runs in results.items():
            rows.append(
                (
                    model,
                    statistics.median(r[0] for r in runs),
                    statistics.median(r[1] for r in runs),
                )
            )
        rate, p50 = _in_process(store, args.seconds)
        rows.append(("ir in-process (1 thread)", rate, p50))
    print(f"{'model':<26} {'req/s':>9} {'p50 ms':>8}   ({args.clients} clients, 1 worker each)")
    for name, rate, p50 in rows:
        print(f"{name:<26} {rate:>9.0f} {p50:>8.2f}")


if __name__ == "__main__":
    main()
