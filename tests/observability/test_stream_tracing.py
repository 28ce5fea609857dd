"""A streamed (decoupled) request over gRPC ModelStreamInfer: a server span per request, under it a
stream span with one event per response and the time to the first one (TTFT)."""
from __future__ import annotations

import asyncio

import grpc
import numpy as np
from helpers.inprocess import traced_server
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

import modelplex
from modelplex import BackendSpec, InferResponse, InferTensor, ModelInstance
from modelplex.core.plugins import create_plugin_manager
from modelplex.observability.tracing import TraceConfig

TICKER_CONFIG = """
name: "ticker"
backend: "ticker"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "N" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "I" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


class Ticker(ModelInstance):
    """Streams 0..N-1, 20 ms apart."""

    def __init__(self, ictx):
        pass

    async def execute(self, requests):
        raise NotImplementedError("decoupled")

    async def stream(self, request):
        for i in range(int(request.inputs[0].data[0])):
            await asyncio.sleep(0.02)
            yield InferResponse("", "", [InferTensor("I", "INT32", [1], np.array([i], np.int32))])


class TickerPlugin:
    @modelplex.hookimpl
    def modelplex_backends(self):
        return [BackendSpec(name="ticker", create_instance=Ticker)]


def test_stream_span_has_an_event_per_response_and_ttft(tmp_path):
    (tmp_path / "ticker" / "1").mkdir(parents=True)
    (tmp_path / "ticker" / "config.pbtxt").write_text(TICKER_CONFIG)
    request = pb.ModelInferRequest(model_name="ticker")
    request.inputs.add(name="N", datatype="INT32", shape=[1])
    request.raw_input_contents.append(np.array([3], np.int32).tobytes())

    async def main():
        plugins = create_plugin_manager(allow=set(), extra=[TickerPlugin()])
        async with traced_server(tmp_path, TraceConfig(level="TIMESTAMPS", rate=1), plugins,
                                 allow_http=False) as (server, exporter):
            async with grpc.aio.insecure_channel(f"127.0.0.1:{server.ports['grpc']}") as channel:
                stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
                call = stub.ModelStreamInfer(iter([request]), metadata=(("traceparent", TRACEPARENT),))
                answers = []
                async for answer in call:
                    assert not answer.error_message, answer.error_message
                    answers.append(answer)
                    if len(answers) == 3:
                        break
                call.cancel()
            await asyncio.sleep(0.1)
            server.dataplane.tracing.flush()
            return answers, exporter.get_finished_spans()

    answers, spans = asyncio.run(main())
    assert len(answers) == 3
    by_name = {s.name: s for s in spans}
    stream, root = by_name["stream ticker"], by_name["ModelStreamInfer"]
    assert stream.parent.span_id == root.context.span_id and format(root.parent.span_id, "016x") == "00f067aa0ba902b7"
    assert [e.attributes["index"] for e in stream.events] == [0, 1, 2]
    assert 15 <= stream.attributes["modelplex.ttft_ms"] < 1000
    assert stream.events[2].attributes["elapsed_ms"] >= 3 * 15
