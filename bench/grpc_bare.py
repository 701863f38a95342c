"""The gRPC ceiling: a bare ``grpc.aio`` server answering TorchServe's ``Predictions`` at once.

``python -m bench.grpc_bare [--port 0]`` prints ``PORT <n>`` and serves until killed: the same
event loop choice as Lantern (uvloop when installed) and the same message types, but no model,
queue, access log or metrics. Its CPU per request is what gRPC itself costs the frontend; compare
it with Lantern's under ``bench.grpcload`` (see docs/performance.md, "gRPC").
"""

from __future__ import annotations

import argparse
import asyncio

import grpc

from serve.grpc.gen import inference_pb2 as pb

SERVICE = "org.pytorch.serve.grpc.inference.InferenceAPIsService"


async def serve(port: int) -> None:
    answer = pb.PredictionResponse(prediction=b"[0.0]")

    async def predictions(request: pb.PredictionsRequest, context: object) -> pb.PredictionResponse:
        return answer

    server = grpc.aio.server()
    handler = grpc.unary_unary_rpc_method_handler(
        predictions,
        request_deserializer=pb.PredictionsRequest.FromString,
        response_serializer=pb.PredictionResponse.SerializeToString,
    )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(SERVICE, {"Predictions": handler}),)
    )
    bound = server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    print(f"PORT {bound}", flush=True)
    await server.wait_for_termination()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    try:
        import uvloop
    except ImportError:
        asyncio.run(serve(args.port))
    else:
        uvloop.run(serve(args.port))


if __name__ == "__main__":
    main()
