"""The trace exporter process (`python -m modelplex.observability.otlp_exporter`, started by the server):
length-prefixed marshal-ed span records (`Recorder.take` batches) on stdin -> OTLP/HTTP protobuf
posts to the collector, each of up to --max-export-batch-size spans: what has arrived is posted once
the pipe holds no more.

One thread: while a post waits for a slow collector it reads no more, the server's pipe fills and
the server drops (and counts) spans. A failed post is dropped after one retry on a fresh
connection. End of input: exit. Headers come from `OTEL_EXPORTER_OTLP_[TRACES_]HEADERS` (k=v,...).
"""
from __future__ import annotations

import argparse
import http.client
import json
import marshal
import os
import select
import signal
import sys
import time
from urllib.parse import unquote, urlsplit

from .otlp_encoding import SpanEncoder
from .trace_spans import SpanDecoder

LOG_EVERY_S = 60.0


def otlp_headers() -> dict[str, str]:
    raw = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_HEADERS") or os.environ.get("OTEL_EXPORTER_OTLP_HEADERS", "")
    headers = {}
    for item in raw.split(","):
        key, sep, value = item.partition("=")
        if sep and key.strip():
            headers[unquote(key.strip())] = unquote(value.strip())
    return headers


def resource_and_scope(attributes: dict[str, str]) -> tuple[bytes, bytes]:
    """Serialized Resource (the SDK's: its telemetry.sdk.* attributes, OTEL_RESOURCE_ATTRIBUTES and
    OTEL_SERVICE_NAME, then `attributes`) and InstrumentationScope, as the SDK's encoder makes them."""
    from opentelemetry.exporter.otlp.proto.common._internal import _encode_instrumentation_scope, _encode_resource
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope

    return (_encode_resource(Resource.create(attributes)).SerializeToString(),
            _encode_instrumentation_scope(InstrumentationScope("modelplex")).SerializeToString())


class Poster:
    """POSTs to one OTLP/HTTP endpoint over a kept-alive connection."""

    def __init__(self, url: str, timeout: float):
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise SystemExit(f"otlp_exporter: not an http(s) URL: {url!r}")
        self.connection_class = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        self.host, self.port, self.timeout = parts.hostname, parts.port, timeout
        self.path = (parts.path or "/v1/traces") + (f"?{parts.query}" if parts.query else "")
        self.headers = {**otlp_headers(), "Content-Type": "application/x-protobuf"}
        self.url, self._connection = url, None
        self.num_failed = self._failed_since_log = 0
        self._last_log = 0.0

    def post(self, body: bytes) -> None:
        for _attempt in (1, 2):  # a kept-alive connection the collector closed fails once
            try:
                if self._connection is None:
                    self._connection = self.connection_class(self.host, self.port, timeout=self.timeout)
                self._connection.request("POST", self.path, body, self.headers)
                response = self._connection.getresponse()
                response.read()
                if response.status < 300:
                    return
                error = f"HTTP {response.status}"
                if response.status < 500 and response.status != 429:
                    break  # the collector refuses the data itself: no retry
            except (OSError, http.client.HTTPException) as e:
                error = f"{type(e).__name__}: {e}"
                self._connection = None
                if isinstance(e, TimeoutError):
                    break  # a hung collector: do not wait for it twice
        self._failed(error)

    def _failed(self, error: str) -> None:
        self.num_failed += 1
        self._failed_since_log += 1
        now = time.monotonic()
        if now - self._last_log >= LOG_EVERY_S:
            print(f"modelplex trace exporter: {self._failed_since_log} export(s) to {self.url} failed, spans dropped "
                  f"(last: {error})", file=sys.stderr, flush=True)
            self._last_log, self._failed_since_log = now, 0


def read_exactly(fd: int, n: int) -> bytes:
    chunks, remaining = [], n
    while remaining:
        chunk = os.read(fd, remaining)
        if not chunk:
            return b""
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", required=True)
    p.add_argument("--resource", default="{}", help="resource attributes (JSON object)")
    p.add_argument("--max-export-batch-size", type=int, default=512)
    p.add_argument("--timeout", type=float, default=5.0)
    args = p.parse_args(argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the server decides when this ends (closing stdin)
    try:
        os.nice(10)  # background work: when CPUs are short, serving requests comes first
    except OSError:
        pass
    encoder = SpanEncoder(*resource_and_scope(json.loads(args.resource)))
    decoder = SpanDecoder()
    poster = Poster(args.url, args.timeout)
    stdin = sys.stdin.fileno()
    pending: list[bytes] = []  # encoded spans not posted yet
    limit = args.max_export_batch_size
    while header := read_exactly(stdin, 4):
        payload = read_exactly(stdin, int.from_bytes(header, "little"))
        if not payload:
            break
        pending += encoder.span_fields(decoder.decode(marshal.loads(payload)))
        while len(pending) >= limit:
            poster.post(encoder.request(pending[:limit]))
            del pending[:limit]
        if pending and not select.select([stdin], [], [], 0)[0]:  # nothing more waiting: post what there is
            poster.post(encoder.request(pending))
            pending = []
    if pending:
        poster.post(encoder.request(pending))
    return 0


if __name__ == "__main__":
    sys.exit(main())
