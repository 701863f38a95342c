"""The two gRPC listeners, on the frontend's event loop (``grpc.aio``), beside the HTTP ones.

Inference port (7070): TorchServe's ``InferenceAPIsService``, the Open Inference Protocol under
both its names, TF Serving's ``PredictionService`` and ``ModelService``, ONNX Runtime Server's
``PredictionService``, health and reflection.
Management port (7071): ``ManagementAPIsService``, health and reflection. With token auth, every
call of the TorchServe, OIP and TF Serving services needs
``authorization: Bearer <key>`` with its port's key (PERMISSION_DENIED otherwise, as TorchServe);
health and reflection stay open, as ``/ping`` does. Both stop when the server's stop event is
set: no new calls, and those in flight get ``drain_timeout`` to finish.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from serve.grpc import descriptors
from serve.grpc.calls import Methods
from serve.grpc.health import Health
from serve.grpc.inference import SERVICE as INFERENCE_SERVICE
from serve.grpc.inference import InferenceService
from serve.grpc.management import SERVICE as MANAGEMENT_SERVICE
from serve.grpc.management import ManagementService
from serve.grpc.oip import SERVICES as OIP_SERVICES
from serve.grpc.oip import OipService
from serve.grpc.ort import SERVICE as ORT_SERVICE
from serve.grpc.ort import OrtService
from serve.grpc.tfserving import TfServingService
from serve.http.common import ServerState

logger = logging.getLogger(__name__)

HEALTH_SERVICE = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name


class GrpcServers:
    """Start with `start`; they stop by themselves when ``stop_event`` is set."""

    def __init__(self, state: ServerState, stop_event: asyncio.Event) -> None:
        self.state = state
        self.config = state.config
        self.stop_event = stop_event
        self.addresses: dict[str, str] = {}
        self._servers: list[grpc.aio.Server] = []
        self._stopper: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Bind and start both listeners; raises ``OSError`` when a port cannot be bound."""
        config = self.config
        health = Health(self.state, self.stop_event)
        inference: list[Any] = [InferenceService(self.state).handlers(self._methods("inference"))]
        services = {INFERENCE_SERVICE: inference[0]}
        if config.ts_open_inference_protocol is not False:
            oip = OipService(self.state)
            for name in OIP_SERVICES:
                services[name] = oip.handlers(self._methods("inference"), name)
        services.update(TfServingService(self.state).handlers(self._methods("inference")))
        services[ORT_SERVICE] = OrtService(self.state).handlers(self._methods("inference"))
        await self._start_one("grpc_inference", services, health)
        management = ManagementService(self.state).handlers(self._methods("management"))
        await self._start_one("grpc_management", {MANAGEMENT_SERVICE: management}, health)
        self._stopper = asyncio.create_task(self._stop_on_event())

    def _methods(self, kind: str) -> Methods:
        return Methods(self.state.metrics, self.state.auth, kind)

    async def _start_one(self, name: str, services: dict[str, Any], health: Health) -> None:
        config = self.config
        server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", config.max_request_size),
                ("grpc.max_send_message_length", config.max_response_size),
                ("grpc.so_reuseport", 0),
                # Metadata is gRPC's headers: one bound, max_header_size, answered
                # RESOURCE_EXHAUSTED by grpc itself. Soft and hard limit alike: grpc refuses
                # at random between them otherwise (defaults 8 and 16 KiB).
                ("grpc.max_metadata_size", config.max_header_size),
                ("grpc.absolute_max_metadata_size", config.max_header_size),
            ]
        )
        for service, handlers in services.items():
            handler = grpc.method_handlers_generic_handler(service, handlers)
            server.add_generic_rpc_handlers((handler,))
        health_pb2_grpc.add_HealthServicer_to_server(health, server)
        names = [*services, HEALTH_SERVICE, reflection.SERVICE_NAME]
        reflection.enable_server_reflection(names, server, pool=descriptors.pool())
        host = getattr(config, f"{name}_address")
        port = getattr(config, f"{name}_port")
        target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        try:
            if config.enable_grpc_ssl:
                bound = server.add_secure_port(target, _credentials(config))
            else:
                bound = server.add_insecure_port(target)
        except RuntimeError:  # grpcio raises where older versions returned 0
            bound = 0
        if bound == 0:
            await self.stop(0)
            cause = _bind_failure(host, port)  # grpc says only that it could not
            reason = (cause.strerror or str(cause)) if cause else "grpc could not bind it"
            error = GrpcListenError(f"Cannot listen on {name} address {target}: {reason}")
            error.errno = cause.errno if cause else None
            raise error
        await server.start()
        self._servers.append(server)
        shown = f"[{host}]" if ":" in host else host
        self.addresses[name] = f"{shown}:{bound}"

    async def _stop_on_event(self) -> None:
        await self.stop_event.wait()
        await self.stop(self.config.drain_timeout)

    async def stop(self, grace: float) -> None:
        """Refuse new calls; let those in flight finish within ``grace`` seconds."""
        servers, self._servers = self._servers, []
        await asyncio.gather(*(s.stop(grace) for s in servers))

    async def wait_stopped(self) -> None:
        """After the stop event: wait until both listeners are closed."""
        if self._stopper is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._stopper
        else:
            await self.stop(0)


def _credentials(config: Any) -> grpc.ServerCredentials:
    """TLS from ``private_key_file`` and ``certificate_file`` (PEM), as TorchServe's gRPC."""
    assert config.private_key_file and config.certificate_file  # Config.validate
    key = Path(config.private_key_file).read_bytes()
    return grpc.ssl_server_credentials([(key, Path(config.certificate_file).read_bytes())])


class GrpcListenError(OSError):
    """A gRPC address that cannot be listened on; the message names it and why."""


def _bind_failure(host: str, port: int) -> OSError | None:
    """Why ``host:port`` cannot be listened on (e.g. "Address already in use"), learnt by trying
    as grpc does (with ``SO_REUSEADDR``); None if it can now."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((host, port))
            probe.listen(1)
    except OSError as exc:
        return exc
    return None
