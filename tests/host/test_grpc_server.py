"""`create_grpc_server` in-process over a real DataPlane: binding, message size, health watch, and streaming
from a small decoupled backend defined here."""
from __future__ import annotations

import asyncio

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tritonclient.grpc import InferResult, service_pb2_grpc
from tritonclient.grpc import service_pb2 as pb

from modelplex import BackendSpec, InferResponse, InferTensor, InvalidInput, ModelInstance
from modelplex.core.settings import ServerConfig
from modelplex.dataplane import DataPlane
from modelplex.grpc.server import create_grpc_server


def make_dataplane(tmp_path, **settings) -> tuple[DataPlane, ServerConfig]:
    config = ServerConfig(model_repositories=[tmp_path], host="127.0.0.1", **{"grpc_port": 0, **settings})
    return DataPlane(config, {}), config


def serve(tmp_path, test, **settings):
    """Run `await test(dataplane, server, port)` against a started server, then stop it."""
    dataplane, config = make_dataplane(tmp_path, **settings)

    async def main():
        await dataplane.manager.start()  # the startup load (of an empty repository): ready from then on
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
            assert (e.value.code(), e.value.details()) == (grpc.StatusCode.NOT_FOUND, "Request for unknown model: 'absent' is not found")

    serve(tmp_path, test, grpc_max_message_bytes=1024 * 1024)


def test_health_watch_reports_the_server_going_not_serving(tmp_path):
    async def test(dataplane, server, port):
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            health = health_pb2_grpc.HealthStub(channel)
            unknown = health.Watch(health_pb2.HealthCheckRequest(service="absent"))
            assert (await unknown.read()).status == health_pb2.HealthCheckResponse.SERVICE_UNKNOWN
            unknown.cancel()
            watch = health.Watch(health_pb2.HealthCheckRequest(service=""))
            assert (await watch.read()).status == health_pb2.HealthCheckResponse.SERVING
            dataplane.accepting = False  # what the server does when shutdown starts
            update = await asyncio.wait_for(watch.read(), timeout=5)
            assert update.status == health_pb2.HealthCheckResponse.NOT_SERVING
            assert await asyncio.wait_for(watch.read(), timeout=5) is grpc.aio.EOF, "shutdown ends the watch"
            check = await health.Check(health_pb2.HealthCheckRequest(service=""))
            assert check.status == health_pb2.HealthCheckResponse.NOT_SERVING

    serve(tmp_path, test)


# ---- ModelStreamInfer over a decoupled model ---------------------------------------------
COUNTDOWN_CONFIG = """
name: "countdown"
backend: "countdown"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "N" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "LEFT" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""


class Countdown(ModelInstance):
    """A decoupled model: for N it streams N-1 ... 0, one response each; N < 0 fails after one response."""

    async def execute(self, requests):
        raise AssertionError("a decoupled model is only streamed")

    async def stream(self, request):
        n = int(request.input("N").data[0])
        for left in range(abs(n) - 1, -1, -1):
            await asyncio.sleep(0.05)  # long enough that concurrent requests overlap even on a loaded machine
            yield InferResponse("", "", [InferTensor.from_numpy("LEFT", np.array([left], np.int32))])
            if n < 0:
                raise InvalidInput("negative countdowns stop after one step")


def countdown_request(n: int, request_id: str, empty_final: bool = True) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="countdown", id=request_id)
    request.inputs.add(name="N", datatype="INT32", shape=[1]).contents.int_contents.append(n)
    if empty_final:
        request.parameters["triton_enable_empty_final_response"].bool_param = True
    return request


def test_stream_interleaves_decoupled_responses_and_reports_errors_in_band(tmp_path):
    (tmp_path / "countdown" / "1").mkdir(parents=True)
    (tmp_path / "countdown" / "config.pbtxt").write_text(COUNTDOWN_CONFIG)
    config = ServerConfig(model_repositories=[tmp_path], host="127.0.0.1", grpc_port=0)
    dataplane = DataPlane(config, {"countdown": BackendSpec(name="countdown", create_instance=lambda ictx: Countdown(),
                                                        max_concurrency_per_instance=4)})
    manager = dataplane.manager

    async def main():
        await manager.start()
        server, port = create_grpc_server(dataplane, config)
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
                requests = [countdown_request(3, "a"), countdown_request(2, "b"), countdown_request(-5, "bad"),
                            countdown_request(1, "c", empty_final=False)]
                received = [r async for r in stub.ModelStreamInfer(iter(requests))]
                with pytest.raises(grpc.aio.AioRpcError) as e:
                    await stub.ModelInfer(countdown_request(1, "unary"))
                assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "decoupled" in e.value.details()
        finally:
            await server.stop(None)
            await manager.stop()
        return received

    received = asyncio.run(main())
    by_id: dict[str, list] = {}
    errors = []
    for item in received:
        if item.error_message:
            errors.append(item.error_message)
            continue
        response = item.infer_response
        final = response.parameters["triton_final_response"].bool_param
        left = InferResult(response).as_numpy("LEFT")
        by_id.setdefault(response.id, []).append((None if left is None else int(left[0]), final))
    assert by_id == {"a": [(2, False), (1, False), (0, False), (None, True)],
                     "b": [(1, False), (0, False), (None, True)],
                     "bad": [(4, False)],
                     "c": [(0, False)]}
    assert errors == ["negative countdowns stop after one step"]
    ids_in_order = [item.infer_response.id for item in received if not item.error_message]
    assert ids_in_order.index("b") < ids_in_order.index("a") + 3, "responses of concurrent requests interleave"
