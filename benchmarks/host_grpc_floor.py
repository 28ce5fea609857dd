"""Reference point for the gRPC rows of `host.py`: a grpc.aio server whose ModelInfer does no work.

It answers every request with a prebuilt, correct `simple` response, so its CPU per request is what
grpc.aio (+ uvloop, as `modelplex serve` runs it) costs by itself: the floor any Python handler adds to.

    .venv/bin/python benchmarks/host_grpc_floor.py --port 18291 &
    .venv/bin/python benchmarks/host_load.py grpc --url 127.0.0.1:18291 --concurrency 64 --seconds 10
    # server CPU per request: /proc/PID/stat utime+stime before/after, over num_finished
"""
from __future__ import annotations

import argparse
import asyncio

import numpy as np
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc


def prebuilt_answer() -> pb.ModelInferResponse:
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.ones((1, 16), np.int32)
    response = pb.ModelInferResponse(model_name="simple", model_version="1")
    for name, value in (("OUTPUT0", a + b), ("OUTPUT1", a - b)):
        response.outputs.add(name=name, datatype="INT32", shape=[1, 16])
        response.raw_output_contents.append(value.tobytes())
    return response


class NoWorkServicer(service_pb2_grpc.GRPCInferenceServiceServicer):
    def __init__(self):
        self.answer = prebuilt_answer()

    async def ModelInfer(self, request, context):
        return self.answer


async def serve(port: int) -> None:
    import grpc

    server = grpc.aio.server()
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(NoWorkServicer(), server)
    server.add_insecure_port("127.0.0.1:%d" % port)
    await server.start()
    print("grpc floor serving on 127.0.0.1:%d" % port, flush=True)
    await server.wait_for_termination()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--port", type=int, default=18291)
    p.add_argument("--loop", choices=["uvloop", "asyncio"], default="uvloop")
    args = p.parse_args()
    if args.loop == "uvloop":
        import uvloop

        uvloop.run(serve(args.port))
    else:
        asyncio.run(serve(args.port))


if __name__ == "__main__":
    main()
