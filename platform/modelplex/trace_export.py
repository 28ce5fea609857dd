"""Export of recorded spans, off the request path: a thread takes them from the `SpanBuffer` in
batches and hands them to a sink. In a server the sink is an exporter process (`otlp_exporter`)
fed marshal-ed batches through a pipe, so OTLP encoding and HTTP never hold the serving process's
GIL; tests may give an OpenTelemetry SDK `SpanExporter` instead (spans become `ReadableSpan`s).

Bounded everywhere: a slow or hung exporter blocks only the export thread; the buffer then fills
and further spans are dropped and counted. A dead exporter process is restarted, at most every
`RESTART_DELAY_S`; what it would have sent meanwhile is dropped and counted.
"""
from __future__ import annotations

import json
import logging
import marshal
import os
import subprocess
import sys
import threading
import time

from .trace_spans import SpanBuffer, expand_children

log = logging.getLogger(__name__)
RESTART_DELAY_S = 5.0
PIPE_BYTES = 1 << 20  # the pipe to the exporter holds about two full batches (Linux: F_SETPIPE_SZ)


class ExportThread:
    """Every `delay_s` (or as soon as a full batch waits) sends what the buffer holds to `sink`."""

    def __init__(self, buffer: SpanBuffer, sink, delay_s: float, batch_size: int):
        self.buffer, self.sink, self.delay_s, self.batch_size = buffer, sink, delay_s, batch_size
        self._stopping = False
        self._lock = threading.Lock()  # one drain at a time (the thread, or a caller's flush)
        self._thread = threading.Thread(target=self._run, name="trace-export", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        next_flush = time.monotonic() + self.delay_s
        while not self._stopping:
            # Wakes at least every second to keep the clock offsets fresh.
            full = self.buffer.batch_ready.wait(min(1.0, max(0.0, next_flush - time.monotonic())))
            self.buffer.clocks.refresh()
            if full or time.monotonic() >= next_flush:
                self.buffer.batch_ready.clear()
                self.flush()
                next_flush = time.monotonic() + self.delay_s

    def flush(self) -> None:
        """Send everything buffered now, in batches."""
        with self._lock:
            while batch := self.buffer.take(self.batch_size):
                try:
                    self.sink.send(batch)
                except Exception:  # noqa: BLE001 - export must never end the thread
                    self.buffer.num_dropped += len(batch)
                    log.exception("trace export failed; %d spans dropped", len(batch))

    def stop(self, timeout: float) -> None:
        """Send what is left and close the sink, within about `timeout` s."""
        deadline = time.monotonic() + timeout
        self._stopping = True
        self.buffer.batch_ready.set()
        self._thread.join(timeout / 2)
        if not self._thread.is_alive():  # else it hangs on a stuck sink: spans still buffered are lost
            self.flush()
        self.sink.close(max(0.0, deadline - time.monotonic()))

    @property
    def num_dropped(self) -> int:
        return self.buffer.num_dropped + getattr(self.sink, "num_dropped", 0)


class ExporterProcess:
    """`python -m modelplex.otlp_exporter`: reads length-prefixed marshal batches of `SpanData` on
    stdin, encodes them as OTLP protobuf and posts them to the collector."""

    def __init__(self, url: str, resource: dict[str, str], batch_size: int, timeout_s: float = 5.0):
        self.command = [sys.executable, "-m", "modelplex.otlp_exporter", "--url", url, "--resource",
                        json.dumps(resource), "--max-export-batch-size", str(batch_size), "--timeout", str(timeout_s)]
        self.num_dropped = 0
        self._proc: subprocess.Popen | None = None
        self._started = 0.0
        self._start()

    def _start(self) -> None:
        self._started = time.monotonic()
        # Its own session: a terminal's Ctrl-C reaches the server, which then closes the pipe (the
        # exporter sends what it has and exits); if the server dies, the exporter sees end of file.
        self._proc = subprocess.Popen(self.command, stdin=subprocess.PIPE, start_new_session=True)
        try:
            import fcntl

            fcntl.fcntl(self._proc.stdin.fileno(), 1031, PIPE_BYTES)  # F_SETPIPE_SZ (Linux)
        except (ImportError, OSError):
            pass

    def send(self, batch: list[tuple]) -> None:
        if self._proc.poll() is not None:
            if time.monotonic() - self._started < RESTART_DELAY_S:
                self.num_dropped += len(batch)
                return
            log.warning("trace exporter process exited with %s; restarting it", self._proc.returncode)
            self._start()
        data = marshal.dumps(batch)
        view = memoryview(len(data).to_bytes(4, "little") + data)
        try:
            while view:  # blocking writes: they wait (GIL released) while the exporter is behind
                view = view[os.write(self._proc.stdin.fileno(), view):]
        except OSError as e:  # the exporter died mid-batch
            self.num_dropped += len(batch)
            log.warning("trace exporter process is gone (%s); %d spans dropped", e, len(batch))

    def close(self, timeout: float) -> None:
        """End of input: the exporter posts what it has and exits; killed if it takes longer."""
        try:
            self._proc.stdin.close()
        except OSError:
            pass
        try:
            self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()


class SdkExporterSink:
    """Hands spans to an OpenTelemetry SDK `SpanExporter` (e.g. the in-memory one of tests)."""

    def __init__(self, exporter, resource: dict[str, str]):
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.util.instrumentation import InstrumentationScope

        self.exporter = exporter
        self.resource, self.scope = Resource.create(resource), InstrumentationScope("modelplex")

    def send(self, batch: list[tuple]) -> None:
        self.exporter.export([readable_span(s, self.resource, self.scope) for s in expand_children(batch)])

    def close(self, timeout: float) -> None:
        self.exporter.shutdown()


def readable_span(s: tuple, resource, scope):
    """A `SpanData` tuple as the SDK's `ReadableSpan`."""
    from opentelemetry.sdk.trace import Event, ReadableSpan
    from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags, TraceState

    (trace_id, span_id, parent_id, parent_is_remote, trace_state, name, kind, start, end, attributes,
     events, status_code, status_message) = s
    flags = TraceFlags(TraceFlags.SAMPLED)
    state = TraceState.from_header([trace_state]) if trace_state else None
    parent = SpanContext(trace_id, parent_id, parent_is_remote, flags, state) if parent_id else None
    return ReadableSpan(
        name, SpanContext(trace_id, span_id, False, flags, state), parent, resource, attributes,
        events=[Event(n, a, t) for t, n, a in events or ()], kind=SpanKind(kind - 1),
        status=Status(StatusCode(status_code), status_message or None), start_time=start, end_time=end,
        instrumentation_scope=scope)
