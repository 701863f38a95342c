"""A closed-loop gRPC load generator: TorchServe's ``Predictions`` from several processes.

``python -m bench.grpcload HOST:PORT MODEL -c 32 -d 5 [-p 2]`` sends ``$BENCH_BODY`` as the
``data`` input from ``-c`` concurrent calls, spread over ``-p`` processes (each its own channel,
i.e. HTTP/2 connection, and event loop), for ``-d`` seconds, and prints the same ``BENCH_JSON``
line as ``pyload``/``post.lua``. ``--kind tfserving`` or ``--kind oip`` sends TF Serving's
``Predict`` or the Open Inference Protocol's ``ModelInfer`` instead, with the FP32 array in
``$BENCH_TENSOR`` (a ``.npy`` file) as input ``$BENCH_INPUT``. No ``ghz`` package exists for this
machine; to keep the generator from being the bottleneck it sends pre-serialized request bytes
and does not decode the answers (``grpc.aio``, uvloop when installed), and several processes
share the load.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import time
from pathlib import Path

PATHS = {
    "torchserve": "/org.pytorch.serve.grpc.inference.InferenceAPIsService/Predictions",
    "tfserving": "/tensorflow.serving.PredictionService/Predict",
    "oip": "/inference.GRPCInferenceService/ModelInfer",
}


def _request_bytes(model: str, kind: str) -> bytes:
    if kind == "torchserve":
        from serve.grpc.gen import inference_pb2

        body = Path(os.environ["BENCH_BODY"]).read_bytes()
        return inference_pb2.PredictionsRequest(
            model_name=model, input={"data": body}
        ).SerializeToString()
    import numpy as np

    array = np.load(os.environ["BENCH_TENSOR"]).astype("<f4")
    name = os.environ.get("BENCH_INPUT", "x")
    if kind == "tfserving":
        from serve.grpc.gen.tensorflow.core.framework import types_pb2
        from serve.grpc.gen.tensorflow_serving.apis import predict_pb2

        request = predict_pb2.PredictRequest()
        request.model_spec.name = model
        tensor = request.inputs[name]
        tensor.dtype = types_pb2.DT_FLOAT
        for size in array.shape:
            tensor.tensor_shape.dim.add(size=size)
        tensor.tensor_content = array.tobytes()
        return request.SerializeToString()
    from serve.grpc.gen import open_inference_grpc_pb2 as oip

    infer = oip.ModelInferRequest(model_name=model)
    infer.inputs.add(name=name, datatype="FP32", shape=list(array.shape))
    infer.raw_input_contents.append(array.tobytes())
    return infer.SerializeToString()


async def _drive(target: str, path: str, request: bytes, concurrency: int, seconds: float) -> dict:
    import grpc

    latencies: list[float] = []
    errors = {"connect": 0, "read": 0, "write": 0, "status": 0, "timeout": 0}
    async with grpc.aio.insecure_channel(target) as channel:
        await channel.channel_ready()
        # bytes in, bytes out: no protobuf work per call
        call: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(path)
        deadline = time.perf_counter() + seconds

        async def loop() -> None:
            while time.perf_counter() < deadline:
                started = time.perf_counter()
                try:
                    await call(request, timeout=30)
                except grpc.aio.AioRpcError as exc:
                    key = "timeout" if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED else "status"
                    errors[key] += 1
                else:
                    latencies.append(time.perf_counter() - started)

        started = time.perf_counter()
        await asyncio.gather(*(loop() for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
    return {"latencies": latencies, "errors": errors, "elapsed": elapsed}


def _worker(args: tuple[str, str, bytes, int, float], queue: multiprocessing.Queue) -> None:
    target, path, request, concurrency, seconds = args
    coro = _drive(target, path, request, concurrency, seconds)
    try:
        import uvloop

        queue.put(uvloop.run(coro))
    except ImportError:
        queue.put(asyncio.run(coro))


def run(
    target: str,
    model: str,
    concurrency: int,
    seconds: float,
    processes: int,
    kind: str = "torchserve",
) -> dict:
    request = _request_bytes(model, kind)
    processes = max(1, min(processes, concurrency))
    shares = [concurrency // processes + (i < concurrency % processes) for i in range(processes)]
    queue: multiprocessing.Queue = multiprocessing.Queue()
    procs = [
        multiprocessing.Process(
            target=_worker, args=((target, PATHS[kind], request, n, seconds), queue)
        )
        for n in shares
    ]
    for p in procs:
        p.start()
    parts = [queue.get(timeout=seconds + 120) for _ in procs]
    for p in procs:
        p.join()
    ordered = sorted(x for part in parts for x in part["latencies"])
    elapsed = max(part["elapsed"] for part in parts)
    errors = {k: sum(part["errors"][k] for part in parts) for k in parts[0]["errors"]}

    def pct(p: float) -> float:
        if not ordered:
            return 0.0
        return ordered[min(len(ordered) - 1, max(0, round(p / 100 * len(ordered)) - 1))]

    us = 1e6
    return {
        "requests": len(ordered),
        "duration_us": elapsed * us,
        **errors,
        "p50_us": pct(50) * us,
        "p90_us": pct(90) * us,
        "p99_us": pct(99) * us,
        "mean_us": (sum(ordered) / len(ordered) * us) if ordered else 0.0,
        "max_us": (ordered[-1] * us) if ordered else 0.0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("target", help="host:port of the gRPC inference listener")
    parser.add_argument("model")
    parser.add_argument("-c", "--concurrency", type=int, default=1)
    parser.add_argument("-d", "--duration", type=float, default=5.0)
    parser.add_argument("-p", "--processes", type=int, default=2)
    parser.add_argument("--kind", choices=sorted(PATHS), default="torchserve")
    args = parser.parse_args()
    result = run(
        args.target, args.model, args.concurrency, args.duration, args.processes, args.kind
    )
    print("BENCH_JSON " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
