"""Closed-loop Python load generator for `simple` (KServe v2): one JSON line per run.

Adapted from the workplace's shared `bench/host/loadgen.py`. HTTP = `httpx.AsyncClient` (HTTP/1.1
keep-alive) with a JSON body or a Triton binary-tensor body; gRPC = `tritonclient.grpc` blocking
`infer()` from N threads, one client per thread. OUTPUT0 and OUTPUT1 are checked on every answer.
A request counts only if it starts after the warm-up and ends inside the measuring window.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import struct
import sys
import threading
import time

IN0 = list(range(16))
IN1 = [1] * 16
EXPECT0 = [a + b for a, b in zip(IN0, IN1)]
EXPECT1 = [a - b for a, b in zip(IN0, IN1)]
INFER_PATH = "/v2/models/simple/infer"


def json_body() -> bytes:
    return json.dumps({"inputs": [
        {"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "data": IN0},
        {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "data": IN1},
    ]}, separators=(",", ":")).encode()


def binary_body() -> tuple[bytes, int]:
    """Triton binary tensor extension: JSON header, then the raw INT32 little-endian tensors.

    Returns (body, header length); the length goes in `Inference-Header-Content-Length`.
    Both outputs are asked for as binary too, as `tritonclient.http` does with `binary_data=True`.
    """
    header = json.dumps({
        "inputs": [
            {"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "parameters": {"binary_data_size": 64}},
            {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "parameters": {"binary_data_size": 64}},
        ],
        "outputs": [
            {"name": "OUTPUT0", "parameters": {"binary_data": True}},
            {"name": "OUTPUT1", "parameters": {"binary_data": True}},
        ],
    }, separators=(",", ":")).encode()
    return header + struct.pack("<16i", *IN0) + struct.pack("<16i", *IN1), len(header)


def check_http_answer(status: int, headers, content: bytes) -> str | None:
    """None if the answer holds the right OUTPUT0/OUTPUT1 (JSON or binary outputs), else why not."""
    if status != 200:
        return "HTTP %d: %r" % (status, content[:200])
    n = headers.get("inference-header-content-length")
    doc = json.loads(content[:int(n)] if n is not None else content)
    got, offset = {}, int(n) if n is not None else 0
    for out in doc["outputs"]:
        size = (out.get("parameters") or {}).get("binary_data_size")
        if size is None:
            got[out["name"]] = list(out["data"])
        else:
            got[out["name"]] = list(struct.unpack("<%di" % (size // 4), content[offset:offset + size]))
            offset += size
    if got.get("OUTPUT0") != EXPECT0 or got.get("OUTPUT1") != EXPECT1:
        return "bad outputs: %r" % (got,)
    return None


def pct(sorted_ms: list[float], p: float) -> float | None:
    if not sorted_ms:
        return None
    k = min(len(sorted_ms) - 1, max(0, int(round(p / 100.0 * len(sorted_ms) + 0.5)) - 1))
    return sorted_ms[k]


class Window:
    """Warm-up and measuring window shared by all workers; collects latencies and errors."""

    def __init__(self, warmup: float, seconds: float):
        self.t_warm = time.perf_counter() + warmup
        self.t_end = self.t_warm + seconds
        self.lat_ms: list[float] = []
        self.num_errors = 0
        self.first_error: str | None = None
        self.num_finished = 0  # every answered request, warm-up included: the server's CPU served them all
        self._lock = threading.Lock()

    def record(self, start: float, end: float, why: str | None) -> None:
        with self._lock:
            self.num_finished += 1
            if start < self.t_warm or end > self.t_end:
                return
            if why is None:
                self.lat_ms.append((end - start) * 1000.0)
            else:
                self.num_errors += 1
                self.first_error = self.first_error or why


async def run_http(url: str, body: str, concurrency: int, window: Window) -> None:
    import httpx

    if body == "binary":
        payload, header_len = binary_body()
        headers = {"content-type": "application/octet-stream", "inference-header-content-length": str(header_len)}
    else:
        payload, headers = json_body(), {"content-type": "application/json"}
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=30.0) as client:

        async def worker():
            while (start := time.perf_counter()) < window.t_end:
                try:
                    r = await client.post(INFER_PATH, content=payload, headers=headers)
                    why = check_http_answer(r.status_code, r.headers, r.content)
                except Exception as e:
                    why = repr(e)[:300]
                window.record(start, time.perf_counter(), why)

        await asyncio.gather(*(worker() for _ in range(concurrency)))


def run_grpc(target: str, concurrency: int, window: Window) -> None:
    import numpy as np
    import tritonclient.grpc as grpcclient

    expect0, expect1 = np.array([EXPECT0], np.int32), np.array([EXPECT1], np.int32)

    def worker():
        client = grpcclient.InferenceServerClient(url=target)
        inputs = []
        for name, data in (("INPUT0", IN0), ("INPUT1", IN1)):
            inputs.append(grpcclient.InferInput(name, [1, 16], "INT32"))
            inputs[-1].set_data_from_numpy(np.array([data], np.int32))
        outputs = [grpcclient.InferRequestedOutput("OUTPUT0"), grpcclient.InferRequestedOutput("OUTPUT1")]
        while (start := time.perf_counter()) < window.t_end:
            try:
                res = client.infer("simple", inputs, outputs=outputs)
                ok = (np.array_equal(res.as_numpy("OUTPUT0"), expect0)
                      and np.array_equal(res.as_numpy("OUTPUT1"), expect1))
                why = None if ok else "bad outputs: %r" % (res.as_numpy("OUTPUT0"),)
            except Exception as e:
                why = repr(e)[:300]
            window.record(start, time.perf_counter(), why)
        client.close()

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("protocol", choices=["http", "grpc"])
    p.add_argument("--url", required=True, help="http: base URL; grpc: host:port")
    p.add_argument("--body", choices=["json", "binary"], default="json", help="HTTP body format")
    p.add_argument("--concurrency", type=int, default=1)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--warmup", type=float, default=2.0)
    args = p.parse_args(argv)

    window = Window(args.warmup, args.seconds)
    if args.protocol == "http":
        asyncio.run(run_http(args.url, args.body, args.concurrency, window))
    else:
        run_grpc(args.url, args.concurrency, window)
    lat = sorted(window.lat_ms)
    print(json.dumps({
        "ok": len(lat), "errors": window.num_errors, "first_error": window.first_error,
        "num_finished": window.num_finished,
        "rps": len(lat) / args.seconds, "p50_ms": pct(lat, 50), "p99_ms": pct(lat, 99),
    }), flush=True)
    return 0 if lat else 1


if __name__ == "__main__":
    sys.exit(main())
