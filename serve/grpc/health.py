"""``grpc.health.v1.Health`` answered from the registry, so Kubernetes gRPC probes work.

The service name ``""`` is the whole server: SERVING once the startup models are loaded and every
model has its minimum workers (``/ping``'s rule). A model's name is that model's default version,
SERVING while it has a ready worker; ``name/version`` is one version. Unknown names answer
NOT_FOUND (``Check``) or SERVICE_UNKNOWN (``Watch``), as the standard servicer does. ``Watch``
looks again every ``WATCH_INTERVAL`` seconds and sends each change; a shutdown ends it with
NOT_SERVING.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from serve.http.common import ServerState
from serve.wire.errors import NotFound, ServeError

WATCH_INTERVAL = 1.0
_Status = health_pb2.HealthCheckResponse


class Health(health_pb2_grpc.HealthServicer):
    def __init__(self, state: ServerState, stopping: asyncio.Event) -> None:
        self.state = state
        self.stopping = stopping

    def status(self, service: str) -> Any:
        """The serving status of ``service``; raises `NotFound` for a name nobody registered."""
        registry = self.state.registry
        if self.stopping.is_set():
            healthy = False
            if service:
                self._model(service)  # unknown names stay unknown
        elif not service:
            state = self.state
            healthy = not state.starting and not state.startup_failures and registry.is_healthy()
        else:
            healthy = self._model(service).ready_workers() > 0
        return _Status.SERVING if healthy else _Status.NOT_SERVING

    def _model(self, service: str) -> Any:
        name, _, version = service.partition("/")
        try:
            return self.state.registry.get(name, version or None)
        except ServeError as err:
            raise NotFound(err.message) from None

    async def Check(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            return _Status(status=self.status(request.service))
        except NotFound as err:
            await context.abort(grpc.StatusCode.NOT_FOUND, err.message)

    async def Watch(self, request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        last = None
        while True:
            try:
                current = self.status(request.service)
            except NotFound:
                current = _Status.SERVICE_UNKNOWN
            if current != last:
                yield _Status(status=current)
                last = current
            if self.stopping.is_set():
                return
            try:
                await asyncio.wait_for(self.stopping.wait(), WATCH_INTERVAL)
            except asyncio.TimeoutError:
                pass
