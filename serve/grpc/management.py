"""TorchServe's ``org.pytorch.serve.grpc.management.ManagementAPIsService``.

Each method calls the same operation as the HTTP management API (``serve/core/manage.py``) and puts
what HTTP answers in ``ManagementResponse.msg``: the JSON body for ``DescribeModel`` and
``ListModels``, the ``status`` text for the others (TorchServe's shapes). Proto3 cannot tell an
unset number from 0: as in TorchServe (``GRPCUtils.getRegisterParam``) 0 means "not given".
"""

from __future__ import annotations

import json
from typing import Any

from google.protobuf.message import Message

from serve.core import manage
from serve.grpc.calls import Call, Methods, UnaryFn, decoder
from serve.grpc.gen import management_pb2 as pb
from serve.http.common import ServerState
from serve.wire.errors import BadRequest

SERVICE = "org.pytorch.serve.grpc.management.ManagementAPIsService"
# RegisterModelRequest numbers that are settings; 0 (proto3's "unset") means the default.
_REGISTER_NUMBERS = (
    "batch_size",
    "max_batch_delay",
    "response_timeout",
    "startup_timeout",
    "initial_workers",
)


class ManagementService:
    def __init__(self, state: ServerState) -> None:
        self.state = state
        self.registry = state.registry
        self.config = state.config

    def handlers(self, methods: Methods) -> dict[str, Any]:
        import grpc

        table: dict[str, tuple[UnaryFn, type[Message]]] = {
            "DescribeModel": (self.describe_model, pb.DescribeModelRequest),
            "ListModels": (self.list_models, pb.ListModelsRequest),
            "RegisterModel": (self.register_model, pb.RegisterModelRequest),
            "ScaleWorker": (self.scale_worker, pb.ScaleWorkerRequest),
            "SetDefault": (self.set_default, pb.SetDefaultRequest),
            "UnregisterModel": (self.unregister_model, pb.UnregisterModelRequest),
        }
        return {
            name: grpc.unary_unary_rpc_method_handler(
                methods.unary(f"/{SERVICE}/{name}", fn),
                request_deserializer=decoder(request),
                response_serializer=pb.ManagementResponse.SerializeToString,
            )
            for name, (fn, request) in table.items()
        }

    async def describe_model(self, call: Call, request: pb.DescribeModelRequest) -> Any:
        name = _required(request.model_name, "model_name")
        call.label(name, request.model_version or None)
        data = await manage.describe(
            self.registry, name, request.model_version or None, customized=request.customized
        )
        return _msg(json.dumps(data, indent=2))

    async def list_models(self, call: Call, request: pb.ListModelsRequest) -> Any:
        data = manage.list_models(
            self.registry, request.limit or None, request.next_page_token or None
        )
        return _msg(json.dumps(data, indent=2))

    async def register_model(self, call: Call, request: pb.RegisterModelRequest) -> Any:
        manage.require_model_api(self.config)
        params: dict[str, Any] = {
            "url": request.url,
            "model_name": request.model_name,
            "handler": request.handler,
            "runtime": request.runtime,
            "synchronous": request.synchronous,  # proto3: false unless set, as in TorchServe
        }
        for key in _REGISTER_NUMBERS:
            value = getattr(request, key)
            if value:
                params[key] = value
        call.label(request.model_name or "-", None)
        reply = await manage.register_model(
            self.registry, self.config, params, synchronous_default=False
        )
        return _msg(reply.message)

    async def scale_worker(self, call: Call, request: pb.ScaleWorkerRequest) -> Any:
        name = _required(request.model_name, "model_name")
        version = request.model_version or None
        call.label(name, version)
        min_worker = request.min_worker if request.min_worker > 0 else 1
        max_worker = request.max_worker if request.max_worker > 0 else min_worker
        reply = await manage.scale(
            self.registry, name, version, min_worker, max_worker, synchronous=request.synchronous
        )
        return _msg(reply.message)

    async def set_default(self, call: Call, request: pb.SetDefaultRequest) -> Any:
        name = _required(request.model_name, "model_name")
        version = _required(request.model_version, "model_version")
        call.label(name, version)
        return _msg((await manage.set_default(self.registry, name, version)).message)

    async def unregister_model(self, call: Call, request: pb.UnregisterModelRequest) -> Any:
        manage.require_model_api(self.config)
        name = _required(request.model_name, "model_name")
        call.label(name, request.model_version or None)
        reply = await manage.unregister(
            self.registry, self.config, name, request.model_version or None
        )
        return _msg(reply.message)


def _required(value: str, name: str) -> str:
    if not value:
        raise BadRequest(f"Parameter {name} is required.")
    return value


def _msg(text: str) -> pb.ManagementResponse:
    return pb.ManagementResponse(msg=text)
