"""`grpc.health.v1.Health` for Kubernetes gRPC probes: "" is the server's readiness, a model name its readiness.

grpcio-health-checking's servicers keep statuses that someone must push; ours asks the DataPlane
on every check instead, so it can never disagree with `ServerReady` / `ModelReady`.
"""
from __future__ import annotations

import asyncio

from grpc_health.v1 import health_pb2, health_pb2_grpc
from tritonclient.grpc import service_pb2

from ..core.errors import NotFound
from ..dataplane import DataPlane
from .status import guarded

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
SERVICE_UNKNOWN = health_pb2.HealthCheckResponse.SERVICE_UNKNOWN
# Service names that mean "the whole server".
SERVER_SERVICES = ("", service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"].full_name)


class HealthServicer(health_pb2_grpc.HealthServicer):
    def __init__(self, dataplane: DataPlane, watch_interval_secs: float = 1.0):
        self.dataplane = dataplane
        self.watch_interval_secs = watch_interval_secs

    def status(self, service: str) -> int:
        """SERVING / NOT_SERVING, or SERVICE_UNKNOWN for a name that is neither the server nor a known model."""
        if service in SERVER_SERVICES:
            return SERVING if self.dataplane.ready() else NOT_SERVING
        if self.dataplane.model_ready(service):
            return SERVING
        if any(row["name"] == service for row in self.dataplane.repository_index()):
            return NOT_SERVING
        return SERVICE_UNKNOWN

    @guarded
    async def Check(self, request, context):
        status = self.status(request.service)
        if status == SERVICE_UNKNOWN:
            raise NotFound(f"unknown service or model '{request.service}'")
        return health_pb2.HealthCheckResponse(status=status)

    async def Watch(self, request, context):
        """Sends the status now and again on every change (polled), until the client goes away or the
        server starts shutting down (then NOT_SERVING is the last message, so no watch holds up the stop)."""
        last = None
        while True:
            status = self.status(request.service)
            if status != last:
                yield health_pb2.HealthCheckResponse(status=status)
                last = status
            if not self.dataplane.accepting:
                return
            await asyncio.sleep(self.watch_interval_secs)
