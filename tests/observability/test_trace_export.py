"""OTLP export from a real `modelplex serve` started with Triton's `--trace-config` flags: spans reach an
in-test OTLP/HTTP collector, and a collector that never answers slows no request."""
from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
from helpers.serverproc import ServerProcess
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
BODY = {"inputs": [{"name": n, "datatype": "INT32", "shape": [1, 16], "data": list(range(16))}
                   for n in ("INPUT0", "INPUT1")]}


class Collector:
    """OTLP/HTTP (protobuf) on an ephemeral port; keeps every span it is sent."""

    def __init__(self):
        outer, self.spans, self.resources = self, [], []

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                message = ExportTraceServiceRequest.FromString(self.rfile.read(int(self.headers["Content-Length"])))
                for resource_spans in message.resource_spans:
                    outer.resources.append({a.key: a.value.string_value for a in resource_spans.resource.attributes})
                    for scope in resource_spans.scope_spans:
                        outer.spans.extend(scope.spans)
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_port}/v1/traces"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()


def trace_flags(url: str) -> list[str]:
    return ["--trace-config", "mode=opentelemetry", "--trace-config", "level=TIMESTAMPS",
            "--trace-config", "rate=1", "--trace-config", f"opentelemetry,url={url}",
            "--trace-config", "opentelemetry,resource=service.name=test-modelplex",
            "--trace-config", "opentelemetry,bsp_schedule_delay=100"]


def test_spans_reach_an_otlp_collector(example_repo):
    collector = Collector()
    with ServerProcess([example_repo], *trace_flags(collector.url)) as s:
        r = httpx.post(f"http://{s.http_url}/v2/models/simple/infer", json=BODY,
                       headers={"traceparent": f"00-{TRACE_ID}-00f067aa0ba902b7-01"})
        assert r.status_code == 200
        deadline = time.monotonic() + 10
        while len(collector.spans) < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
    assert sorted(s.name for s in collector.spans) == ["POST /v2/models/simple/infer", "compute", "infer simple", "queue"]
    assert {s.trace_id.hex() for s in collector.spans} == {TRACE_ID}
    assert collector.resources[0]["service.name"] == "test-modelplex"
    # Parent links, kinds, flags and attributes as the exporter process encoded them.
    span = {s.name: s for s in collector.spans}
    server, model = span["POST /v2/models/simple/infer"], span["infer simple"]
    assert server.parent_span_id.hex() == "00f067aa0ba902b7" and server.kind == server.SPAN_KIND_SERVER
    assert server.flags == 0x300  # has-is-remote and is-remote: the parent came from the client
    attributes = {a.key: a.value for a in server.attributes}
    assert attributes["http.response.status_code"].int_value == 200 and attributes["model"].string_value == "simple"
    assert model.parent_span_id == server.span_id and model.kind == model.SPAN_KIND_INTERNAL and model.flags == 0x100
    for phase in (span["queue"], span["compute"]):
        assert phase.parent_span_id == model.span_id
        assert model.start_time_unix_nano <= phase.start_time_unix_nano <= phase.end_time_unix_nano <= model.end_time_unix_nano
    assert [a.value.int_value for a in span["compute"].attributes if a.key == "modelplex.batch_size"] == [1]
    assert server.start_time_unix_nano <= model.start_time_unix_nano <= model.end_time_unix_nano <= server.end_time_unix_nano
    assert len({s.span_id for s in collector.spans}) == 4
    collector.httpd.shutdown()


def test_a_collector_that_never_answers_slows_no_request(example_repo):
    with socket.socket() as blackhole:  # accepts connections (the backlog), never reads or answers
        blackhole.bind(("127.0.0.1", 0))
        blackhole.listen(1000)
        url = f"http://127.0.0.1:{blackhole.getsockname()[1]}/v1/traces"
        s = ServerProcess([example_repo], *trace_flags(url), "--trace-config", "opentelemetry,bsp_max_queue_size=64")
        with s, httpx.Client(base_url=f"http://{s.http_url}") as client:
            def dropped() -> float:
                lines = [line for line in httpx.get(s.metrics_url).text.splitlines()
                         if line.startswith("modelplex_trace_spans_dropped_total ")]
                return float(lines[0].split()[1])

            # Keep sending until the export backlog (the 1 MiB pipe, then the 64-span queue) overflows;
            # what could not be exported is dropped and counted, not queued without bound.
            slowest, num, end = 0.0, 0, time.monotonic() + 60
            while time.monotonic() < end and not (num % 200 == 0 and num and dropped() > 0):
                start = time.monotonic()
                assert client.post("/v2/models/simple/infer", json=BODY).status_code == 200
                slowest, num = max(slowest, time.monotonic() - start), num + 1
            num_dropped = dropped()
            stop_started = time.monotonic()
            assert s.stop() == 0
            stop_seconds = time.monotonic() - stop_started
    # A request waiting on the export would take the exporter's 5 s timeout; 2 s leaves room for a busy host.
    assert slowest < 2.0, f"slowest of {num} requests took {slowest:.3f}s while the collector hung"
    assert num_dropped > 0, f"no span dropped after {num} requests to a collector that never answers"
    # The exit waits at most 2 s for queued spans (the SDK's own exit hook would wait out the exporter).
    assert stop_seconds < 5.0, f"the server took {stop_seconds:.1f}s to exit while the collector hung"


def test_bad_trace_config_is_a_usage_error():
    for flag, message in (("level=LOUD", "trace_level must be a list of OFF or TIMESTAMPS"),
                          ("mode=triton", "only mode=opentelemetry is supported"),
                          ("rate=0", "rate must be an integer >= 1"),
                          ("opentelemetry,colour=red", "unknown setting 'colour'"),
                          ("triton,file=/tmp/t.json", "only the 'opentelemetry' mode is supported")):
        proc = subprocess.run([sys.executable, "-m", "modelplex", "serve", "--model-repository", "/nonexistent",
                               "--trace-config", flag], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2 and message in proc.stderr, (flag, proc.stderr)


def test_the_event_loop_sends_full_batches_at_once_and_the_rest_after_the_delay(ensemble_repo):
    """No flush by hand: a full export batch (counted as 4 spans a request) leaves on the loop's next turn, a partial one after
    `bsp_schedule_delay`, and no thread is started for it (a thread woken for every batch fights
    the event loop for the GIL: ~8 µs a traced request, benchmarks/results/observability.md)."""
    import asyncio

    from helpers.inprocess import traced_server

    from modelplex.observability.tracing import TraceConfig

    # 12 spans: 3 requests' (server, model, queue, compute)
    config = TraceConfig(level="OFF", rate=1, bsp_max_export_batch_size=12, bsp_schedule_delay_ms=300)

    async def main():
        async with traced_server(ensemble_repo, config) as (server, exporter):
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.ports['http']}") as client:
                async def infer():
                    assert (await client.post("/v2/models/simple/infer", json=BODY)).status_code == 200

                await infer()  # untraced: whatever threads serving starts, it has started
                threads = {t.ident for t in threading.enumerate()}
                r = await client.post("/v2/trace/setting", json={"trace_level": ["TIMESTAMPS"]})
                assert r.status_code == 200, r.text
                for _ in range(2):
                    await infer()
                await asyncio.sleep(0.05)
                assert exporter.get_finished_spans() == ()  # a batch is 3 requests' spans; the delay has not passed
                await infer()
                await asyncio.sleep(0.05)
                assert len(exporter.get_finished_spans()) == 12  # 3 x (server, model, queue, compute)
                await infer()
                await asyncio.sleep(0.05)
                assert len(exporter.get_finished_spans()) == 12
                await asyncio.sleep(0.4)
                assert len(exporter.get_finished_spans()) == 16
                assert {t.ident for t in threading.enumerate()} == threads

    asyncio.run(main())
