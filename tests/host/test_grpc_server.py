"""`create_grpc_server` in-process over a DataPlane with an empty repository: binding, message size, health watch."""
from __future__ import annotations

import asyncio

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

from modelplex.dataplane import DataPlane
from modelplex.grpc.server import create_grpc_server
from modelplex.manager import ModelManager
from modelplex.settings import ServerConfig


def make_dataplane(tmp_path, **settings) -> tuple[DataPlane, ServerConfig]:
    config = ServerConfig(model_repositories=[tmp_path], host="127.0.0.1", **{"grpc_port": 0, **settings})
    return DataPlane(config, ModelManager(config, {})), config


def serve(tmp_path, test, **settings):
    """Run `await test(dataplane, server, port)` against a started server, then stop it."""
    dataplane, config = make_dataplane(tmp_path, **settings)

    async def main():
        server, port = create_grpc_server(dataplane, config)
        await server.start()
        try:
            await test(dataplane, server, port)
        finally:
            await server.stop(None)

    asyncio.run(main())


def test_port_zero_binds_an_ephemeral_port_that_serves(tmp_path):
    async def test(dataplane, server, port):
        assert port > 0
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            assert (await stub.ServerLive(pb.ServerLiveRequest())).live
            assert (await stub.ServerReady(pb.ServerReadyRequest())).ready

    serve(tmp_path, test)


def test_a_taken_port_is_an_error_not_a_shared_socket(tmp_path):
    async def test(dataplane, server, port):
        _, config = make_dataplane(tmp_path, grpc_port=port)
        with pytest.raises(RuntimeError):
            create_grpc_server(dataplane, config)

    serve(tmp_path, test)


def test_messages_over_grpc_max_message_bytes_are_refused(tmp_path):
    async def test(dataplane, server, port):
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            request = pb.ModelInferRequest(model_name="absent")
            request.inputs.add(name="X", datatype="INT8", shape=[2 * 1024 * 1024])
            request.raw_input_contents.append(bytes(2 * 1024 * 1024))
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await stub.ModelInfer(request)
            assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            small = pb.ModelInferRequest(model_name="absent")
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await stub.ModelInfer(small)
            assert (e.value.code(), e.value.details()) == (grpc.StatusCode.NOT_FOUND, "model 'absent' is not found")

    serve(tmp_path, test, grpc_max_message_bytes=1024 * 1024)


def test_health_watch_reports_the_server_going_not_serving(tmp_path):
    async def test(dataplane, server, port):
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            health = health_pb2_grpc.HealthStub(channel)
            watch = health.Watch(health_pb2.HealthCheckRequest(service=""))
            assert (await watch.read()).status == health_pb2.HealthCheckResponse.SERVING
            dataplane.accepting = False  # what the server does when shutdown starts
            update = await asyncio.wait_for(watch.read(), timeout=5)
            assert update.status == health_pb2.HealthCheckResponse.NOT_SERVING
            check = await health.Check(health_pb2.HealthCheckRequest(service=""))
            assert check.status == health_pb2.HealthCheckResponse.NOT_SERVING
            watch.cancel()
            unknown = health.Watch(health_pb2.HealthCheckRequest(service="absent"))
            assert (await unknown.read()).status == health_pb2.HealthCheckResponse.SERVICE_UNKNOWN
            unknown.cancel()

    serve(tmp_path, test)
