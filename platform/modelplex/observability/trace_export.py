"""Export of recorded spans, off the request path: batches taken from the `Recorder` go to a
sink, from the event loop the spans end on. In a server the sink is an exporter process
(`otlp_exporter`) fed marshal-ed batches through a pipe, so decoding, OTLP encoding and HTTP never
hold the serving process's GIL; tests may give an OpenTelemetry SDK `SpanExporter` instead (spans
become `ReadableSpan`s).

No thread: a second Python thread in the serving process, woken for every batch, fights a busy
event loop for the GIL (measured in-process on `simple` with the loop never idle: ~1,000 context
switches a wake-up, ~8 µs of CPU a traced request; over sockets at 16 connections the loop waits
in epoll often enough that no difference showed), while a batch of records is one bytes object to
marshal and the pipe write never waits.

Bounded everywhere: while the exporter is behind, its pipe is full and the batch waits for it (the
loop writes the rest when the pipe has room); the buffer then fills and further spans are dropped
and counted. A dead exporter process is restarted, at most every `RESTART_DELAY_S`; what it would
have sent meanwhile is dropped and counted.
"""
from __future__ import annotations

import asyncio
import json
import logging
import marshal
import os
import select
import subprocess
import sys
import time

from .trace_spans import Recorder, SpanDecoder, batch_size_of, expand_children, shared

log = logging.getLogger(__name__)
RESTART_DELAY_S = 5.0
PIPE_BYTES = 1 << 20  # the pipe to the exporter holds about two full batches (Linux: F_SETPIPE_SZ)


class LoopExport:
    """Sends the buffer's spans to `sink` `delay_s` after the first span of a batch, or as soon as a
    full batch waits, on the running event loop (spans end on the server's loop)."""

    def __init__(self, buffer: Recorder, sink, delay_s: float, batch_size: int):
        self.buffer, self.sink, self.delay_s, self.batch_size = buffer, sink, delay_s, batch_size
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._soon = False  # a send is scheduled for the next loop iteration
        self._waiting_fd: int | None = None  # the sink's pipe was full: the loop watches it
        buffer.notify = self._notify

    def _notify(self, count: int) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # a span ended off any loop (none do in a server): sent by the next flush
            return
        self._loop = loop
        if count >= self.batch_size:
            if not self._soon:
                self._soon = True
                loop.call_soon(self._send_due)
        elif self._timer is None:
            self.buffer.refresh_clocks()
            self._timer = loop.call_later(self.delay_s, self._send_due)

    def _send_due(self) -> None:
        self._soon = False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.flush()

    def flush(self) -> None:
        """Send what the buffer holds now, in batches, as far as the sink takes them without waiting;
        the rest follows when the sink's pipe has room (or waits in the bounded buffer)."""
        while not self.sink.busy and (batch := self.buffer.take(self.batch_size)):
            self._send(batch)
        self.buffer.refresh_clocks()
        if self.sink.busy and self._waiting_fd is None and self._loop is not None:
            self._waiting_fd = self.sink.fileno()
            self._loop.add_writer(self._waiting_fd, self._writable)

    def _writable(self) -> None:
        self.sink.write_pending()
        if not self.sink.busy:
            self._stop_waiting()
            self.flush()

    def _stop_waiting(self) -> None:
        if self._waiting_fd is not None:
            self._loop.remove_writer(self._waiting_fd)
            self._waiting_fd = None

    def stop(self, timeout: float) -> None:
        """Send what is left and close the sink, within about `timeout` s (on the loop, or with it
        stopped): spans still queued when the time is up are lost."""
        deadline = time.monotonic() + timeout
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._stop_waiting()
        self.buffer.notify = lambda count: None
        while self.sink.wait_pending(deadline) and (batch := self.buffer.take(self.batch_size)):
            self._send(batch)
        self.sink.close(max(0.0, deadline - time.monotonic()))

    def _send(self, batch: tuple) -> None:
        try:
            self.sink.send(batch)
        except Exception:
            self.buffer.num_dropped += batch_size_of(batch)
            log.exception("trace export failed; %d spans dropped", batch_size_of(batch))

    @property
    def num_dropped(self) -> int:
        return self.buffer.num_dropped + getattr(self.sink, "num_dropped", 0)


class ExporterProcess:
    """`python -m modelplex.observability.otlp_exporter`: reads length-prefixed marshal-ed `Recorder.take` batches
    on stdin, decodes them, encodes them as OTLP protobuf and posts them to the collector. Written
    without blocking: what the pipe cannot take yet is kept (`busy`) until `write_pending` gets it
    through. A batch carries the shared objects its process has not had yet (a restarted process
    gets them all again)."""

    def __init__(self, url: str, resource: dict[str, str], batch_size: int, timeout_s: float = 5.0):
        self.command = [sys.executable, "-m", "modelplex.observability.otlp_exporter", "--url", url, "--resource",
                        json.dumps(resource), "--max-export-batch-size", str(batch_size), "--timeout", str(timeout_s)]
        self.num_dropped = 0
        self._proc: subprocess.Popen | None = None
        self._started = 0.0
        self._pending: memoryview | None = None  # the rest of a batch the pipe could not take yet
        self._pending_spans = 0
        self._start()

    def _start(self) -> None:
        self._started = time.monotonic()
        self._shared_known = 0  # shared objects the process has
        # Its own session: a terminal's Ctrl-C reaches the server, which then closes the pipe (the
        # exporter sends what it has and exits); if the server dies, the exporter sees end of file.
        self._proc = subprocess.Popen(self.command, stdin=subprocess.PIPE, start_new_session=True)
        os.set_blocking(self._proc.stdin.fileno(), False)
        try:
            import fcntl

            fcntl.fcntl(self._proc.stdin.fileno(), 1031, PIPE_BYTES)  # F_SETPIPE_SZ (Linux)
        except (ImportError, OSError):
            pass

    @property
    def busy(self) -> bool:
        return self._pending is not None

    def fileno(self) -> int:
        return self._proc.stdin.fileno()

    def send(self, batch: tuple) -> None:
        if self._proc.poll() is not None:
            if time.monotonic() - self._started < RESTART_DELAY_S:
                self.num_dropped += batch_size_of(batch)
                return
            log.warning("trace exporter process exited with %s; restarting it", self._proc.returncode)
            self._start()
        shared_start, new_shared, *rest = batch
        if self._shared_known < shared_start:  # a new process, or a batch it never got
            new_shared = shared[self._shared_known:shared_start] + new_shared
            shared_start = self._shared_known
        data = marshal.dumps((shared_start, new_shared, *rest))
        self._shared_known = shared_start + len(new_shared)
        self._pending = memoryview(len(data).to_bytes(4, "little") + data)
        self._pending_spans = batch_size_of(batch)
        self.write_pending()

    def write_pending(self) -> None:
        """Writes as much of the pending batch as the pipe takes now."""
        view = self._pending
        try:
            while view:
                view = view[os.write(self._proc.stdin.fileno(), view):]
        except BlockingIOError:
            self._pending = view
            return
        except OSError as e:  # the exporter died mid-batch
            self.num_dropped += self._pending_spans
            log.warning("trace exporter process is gone (%s); %d spans dropped", e, self._pending_spans)
        self._pending = None

    def wait_pending(self, deadline: float) -> bool:
        """Waits (blocking) until the pending batch is written; False if `deadline` came first."""
        while self._pending is not None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            select.select([], [self._proc.stdin], [], remaining)
            self.write_pending()
        return True

    def close(self, timeout: float) -> None:
        """End of input: the exporter posts what it has and exits; killed if it takes longer."""
        if self._pending is not None:  # cut off by the deadline
            self.num_dropped += self._pending_spans
            self._pending = None
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

    busy = False  # export() returns when done

    def __init__(self, exporter, resource: dict[str, str]):
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.util.instrumentation import InstrumentationScope

        self.exporter, self.decoder = exporter, SpanDecoder()
        self.resource, self.scope = Resource.create(resource), InstrumentationScope("modelplex")

    def send(self, batch: tuple) -> None:
        spans = expand_children(self.decoder.decode(batch))
        self.exporter.export([readable_span(s, self.resource, self.scope) for s in spans])

    def wait_pending(self, deadline: float) -> bool:
        return True

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
