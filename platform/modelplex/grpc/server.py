"""Builds the grpc.aio server: Triton's inference service plus health checking, bound to the configured port."""
from __future__ import annotations

import grpc
from grpc_health.v1 import health_pb2_grpc
from tritonclient.grpc import service_pb2_grpc

from ..core.settings import ServerConfig
from ..dataplane import DataPlane
from .health import HealthServicer
from .servicer import InferenceServicer

# --grpc-infer-response-compression-level -> gRPC core's levels (it picks an algorithm the client accepts)
COMPRESSION_LEVELS = {"none": 0, "low": 1, "medium": 2, "high": 3}


def server_options(settings: ServerConfig) -> list[tuple[str, int]]:
    size = settings.grpc_max_message_bytes
    level = COMPRESSION_LEVELS[settings.grpc_compression_level]
    return ([("grpc.default_compression_level", level)] if level else []) + [
        ("grpc.max_receive_message_length", size),
        ("grpc.max_send_message_length", size),
        # A second server on the same fixed port must fail to bind, not share it silently.
        ("grpc.so_reuseport", 0),
        # Ping idle connections every minute so dead peers (NAT, crashed clients) are dropped...
        ("grpc.keepalive_time_ms", 60_000),
        ("grpc.keepalive_timeout_ms", 20_000),
        # ...and accept clients' own keepalive pings (every 10 s or slower) even between calls.
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
    ]


def create_grpc_server(dataplane: DataPlane, settings: ServerConfig, interceptors=(),
                       credentials: grpc.ServerCredentials | None = None, host: str | None = None,
                       port: int | None = None) -> tuple[grpc.aio.Server, int]:
    """An unstarted server and the port it bound on `host` (the real one when `port` is 0; both
    default to the settings' `host` and `grpc_port`);
    `interceptors` run before every method, `credentials` make the port a TLS one.

    grpc.aio on the server's own event loop: the sync `grpc.server` costs about as much per call once
    each call must hop to the loop that runs the DataPlane (measured with tritonclient at c=64).
    """
    server = grpc.aio.server(options=server_options(settings), interceptors=list(interceptors))
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(InferenceServicer(dataplane), server)
    health_pb2_grpc.add_HealthServicer_to_server(HealthServicer(dataplane), server)
    host = settings.host if host is None else host
    port = settings.grpc_port if port is None else port
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    bound = server.add_insecure_port(address) if credentials is None else server.add_secure_port(address, credentials)
    if bound == 0:
        raise RuntimeError(f"gRPC could not bind {address}")
    return server, bound
