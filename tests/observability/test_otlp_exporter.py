"""The exporter process (`python -m modelplex.observability.otlp_exporter`) against a real OTLP/HTTP receiver."""
from __future__ import annotations

import marshal
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from modelplex.observability.trace_spans import new_recorder, share


def receiver():
    """An OTLP/HTTP receiver recording the span names of each post."""
    posts: list[list[str]] = []

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self):  # noqa: N802 - http.server's naming
            request = ExportTraceServiceRequest.FromString(self.rfile.read(int(self.headers["Content-Length"])))
            posts.append([s.name for rs in request.resource_spans for ss in rs.scope_spans for s in ss.spans])
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd, posts


def test_batches_waiting_in_the_pipe_are_posted_together_up_to_the_batch_size():
    """Three hand-offs of three spans, all in the pipe before the exporter reads: posted as 5 + 4 spans
    (the size limit, then the rest once the pipe is drained), not as three posts of 3."""
    httpd, posts = receiver()
    names = [f"s{i}" for i in range(9)]
    recorder, attributes = new_recorder(max_size=16, batch_size=16), share({"k": "v"})
    for name in names:
        recorder.server_span(name, attributes, ()).end()
    data = b"".join(len(m).to_bytes(4, "little") + m for m in (marshal.dumps(recorder.take(3)) for _ in range(3)))
    try:
        proc = subprocess.run([sys.executable, "-m", "modelplex.observability.otlp_exporter", "--url",
                               f"http://127.0.0.1:{httpd.server_port}/v1/traces", "--max-export-batch-size", "5"],
                              input=data, capture_output=True, timeout=60)
    finally:
        httpd.shutdown()
    assert proc.returncode == 0, proc.stderr.decode()
    assert posts == [names[:5], names[5:]]
