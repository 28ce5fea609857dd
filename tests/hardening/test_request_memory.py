"""Issue 29, bounded gRPC streams and the request-memory guard: a client that kept sending 4 MB requests
on one ModelStreamInfer stream to a slow model and never read drove the server from 121 MB to 5.1 GB.
A stream now runs a bounded number of requests and queues a bounded number of responses, then stops
reading (gRPC's flow control holds the client back); request bodies in flight have a server-wide budget
(503 / RESOURCE_EXHAUSTED beyond it); large transient use is trimmed back to the OS."""
from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest
from helpers.serverproc import ServerProcess
from tritonclient.grpc import service_pb2, service_pb2_grpc

from modelplex.core.errors import Overloaded
from modelplex.models import memory

MB = 1 << 20
CONFIG = """name: "slow_echo"
backend: "python"
input [ { name: "X" data_type: TYPE_UINT8 dims: [ -1 ] } ]
output [ { name: "X" data_type: TYPE_UINT8 dims: [ -1 ] } ]
"""
MODEL = '''
import time
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        time.sleep(0.5)
        return [pb_utils.InferenceResponse([pb_utils.get_input_tensor_by_name(r, "X")]) for r in requests]
'''


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    repo = tmp_path_factory.mktemp("slow_repo")
    (repo / "slow_echo" / "1").mkdir(parents=True)
    (repo / "slow_echo" / "config.pbtxt").write_text(CONFIG)
    (repo / "slow_echo" / "1" / "model.py").write_text(MODEL)
    return repo


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def request(size: int, i: int = 0) -> service_pb2.ModelInferRequest:
    msg = service_pb2.ModelInferRequest(model_name="slow_echo", id=str(i))
    msg.inputs.add(name="X", datatype="UINT8", shape=[size])
    msg.raw_input_contents.append(bytes(size))
    return msg


def stub_for(server: ServerProcess) -> service_pb2_grpc.GRPCInferenceServiceStub:
    channel = grpc.insecure_channel(server.grpc_url, options=[("grpc.max_send_message_length", 64 * MB),
                                                              ("grpc.max_receive_message_length", 64 * MB)])
    return service_pb2_grpc.GRPCInferenceServiceStub(channel)


def test_a_stream_that_is_never_read_holds_bounded_memory(repo):
    """Up to 300 requests of 4 MB (1.2 GB) for at most 12 s on one stream whose responses are never read."""
    with ServerProcess([repo], "--grpc-stream-max-inflight", "4", "--grpc-stream-max-queued-responses", "4",
                       env={"MODELPLEX_PLUGINS": "python"}) as s:
        pid, stub = s.proc.pid, stub_for(s)
        stub.ModelInfer(request(4 * MB))  # warm: the first 4 MB request's buffers are in the baseline
        baseline, peak, sent = rss_mb(pid), 0.0, [0]
        stop = time.monotonic() + 12

        def flood():
            while sent[0] < 300 and time.monotonic() < stop:
                sent[0] += 1
                yield request(4 * MB, sent[0])

        call = stub.ModelStreamInfer(flood())  # never iterated: the client reads nothing
        while time.monotonic() < stop:
            peak = max(peak, rss_mb(pid))
            time.sleep(0.2)
        call.cancel()
        assert peak - baseline < 250, f"RSS grew {peak - baseline:.0f} MB ({baseline:.0f} -> {peak:.0f}), {sent[0]} sent"
        assert sent[0] < 100, f"the client could send {sent[0]} requests: nothing held it back"
        assert httpx.get(f"http://{s.http_url}/v2/health/ready", timeout=10).status_code == 200
        # The stream's requests were abandoned with it; the server serves on.
        assert len(stub.ModelInfer(request(16)).raw_output_contents[0]) == 16


def test_request_bodies_past_the_memory_budget_are_refused_on_http_and_grpc(repo):
    with ServerProcess([repo], "--max-request-memory-bytes", str(10 * MB), env={"MODELPLEX_PLUGINS": "python"}) as s:
        body = np.zeros(4 * MB, np.uint8).tobytes()
        header = (b'{"inputs":[{"name":"X","shape":[%d],"datatype":"UINT8","parameters":{"binary_data_size":%d}}]}'
                  % (len(body), len(body)))

        def http_one(_):
            r = httpx.post(f"http://{s.http_url}/v2/models/slow_echo/infer", content=header + body, timeout=60,
                           headers={"Inference-Header-Content-Length": str(len(header))})
            return r.status_code, r.text

        with ThreadPoolExecutor(4) as pool:
            results = list(pool.map(http_one, range(4)))
        refused = [text for status, text in results if status == 503]
        assert refused and all("--max-request-memory-bytes" in text for text in refused), results
        assert any(status == 200 for status, _ in results)

        stub = stub_for(s)
        with ThreadPoolExecutor(4) as pool:
            futures = [pool.submit(stub.ModelInfer, request(4 * MB, i)) for i in range(4)]
            codes = []
            for f in futures:
                try:
                    f.result()
                    codes.append("OK")
                except grpc.RpcError as e:
                    codes.append(e.code().name)
                    assert "--max-request-memory-bytes" in e.details()
        assert "RESOURCE_EXHAUSTED" in codes and "OK" in codes, codes


def test_large_transient_use_is_trimmed_at_a_bounded_rate(monkeypatch):
    trims = []
    monkeypatch.setattr(memory, "_MALLOC_TRIM", lambda pad: trims.append(threading.current_thread().name))

    async def run():
        guard = memory.RequestMemory(limit=600 * MB)
        with pytest.raises(Overloaded, match="--max-request-memory-bytes"):
            guard.reserve(601 * MB)
        for _ in range(3):  # 3 x 300 MB come and go at once: one trim, not three
            guard.reserve(300 * MB)
            guard.release(300 * MB)
        await asyncio.sleep(0.1)
        assert guard.in_use == 0 and guard.num_refused == 1

    asyncio.run(run())
    assert len(trims) == 1 and trims[0] != "MainThread"
