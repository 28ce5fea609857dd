"""The server's handle on one worker process: start and handshake, frames in and out, death and its reason.

Frames are read on a thread (blocking reads never touch the event loop) and written by another
thread from a queue, so a worker that stops reading can never block the loop either.
"""
from __future__ import annotations

import logging
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable

from .protocol import Channel, ChannelClosed, frame

log = logging.getLogger(__name__)


def start_worker(title: str) -> tuple[subprocess.Popen, Channel]:
    """Spawn `python -m modelplex_python.worker` with one end of a socket pair."""
    parent_sock, child_sock = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}  # the model's prints reach the server log at once
    try:
        proc = subprocess.Popen([sys.executable, "-m", "modelplex_python.worker", str(child_sock.fileno())],
                                pass_fds=[child_sock.fileno()], env=env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    finally:
        child_sock.close()
    threading.Thread(target=_relay_output, args=(title, proc.stdout), name=f"python-{title}-output",
                     daemon=True).start()
    log.info("started python worker %s (pid %d)", title, proc.pid)
    return proc, Channel(parent_sock)


def _relay_output(title: str, output) -> None:
    """The model's prints and tracebacks, into the server's stderr with the instance's name in front
    (several workers write at once; unprefixed lines could not be told apart)."""
    with output:
        for line in output:
            sys.stderr.write(f"[{title}] {line.decode(errors='replace')}")


def exit_reason(title: str, returncode: int | None) -> str:
    if returncode is None:
        return f"python worker for {title} closed its channel"
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = "unknown signal"
        return f"python worker for {title} exited with signal {-returncode} ({name})"
    return f"python worker for {title} exited with code {returncode}"


class WorkerProcess:
    """A started, initialised worker. `on_message(header, buffers)` and `on_exit(reason)` are called
    on the reader thread; `on_exit` once, unless the server itself is closing the worker."""

    def __init__(self, title: str, proc: subprocess.Popen, channel: Channel,
                 on_message: Callable[[dict, list], None], on_exit: Callable[[str], None]):
        self.title, self.proc, self.channel = title, proc, channel
        self.failure: str | None = None  # set before a deliberate kill, so the reason names the cause
        self.closing = False
        self._on_message, self._on_exit = on_message, on_exit
        self._outbox: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._read, name=f"python-{title}-reader", daemon=True).start()
        threading.Thread(target=self._write, name=f"python-{title}-writer", daemon=True).start()

    @classmethod
    def launch(cls, title: str, init: dict, timeout: float, on_message, on_exit,
               on_cancel: Callable[[Callable[[], None]], Callable[[], None]] | None = None) -> WorkerProcess:
        """Start a worker and wait (blocking) until model.py initialised; raises RuntimeError with the cause.
        `on_cancel` (the host's `InstanceContext.cancel.on_cancel`): a load the host gives up on kills
        the worker, which ends this wait, instead of leaving it to finish its initialize unobserved."""
        proc, channel = start_worker(title)
        forget = on_cancel(lambda: _kill(proc)) if on_cancel is not None else (lambda: None)
        try:
            return cls._handshake(title, proc, channel, init, timeout, on_message, on_exit)
        finally:
            forget()

    @classmethod
    def _handshake(cls, title, proc, channel, init, timeout, on_message, on_exit) -> WorkerProcess:
        try:
            channel.sock.settimeout(timeout)
            channel.send(init)
            header, _ = channel.receive()
            channel.sock.settimeout(None)
        except TimeoutError:
            kill_and_close(proc, channel)
            raise RuntimeError(f"python worker for {title} did not initialize within {timeout:g} s") from None
        except (ChannelClosed, OSError):
            kill_and_close(proc, channel)
            raise RuntimeError(exit_reason(title, proc.returncode) + " during initialize") from None
        if header["op"] != "ready":
            kill_and_close(proc, channel)
            raise RuntimeError(f"initialize failed: {header.get('message', header)}")
        return cls(title, proc, channel, on_message, on_exit)

    def send(self, header: dict, buffers=()) -> None:
        """Queue one frame for the writer thread; never blocks."""
        self._outbox.put(frame(header, list(buffers)))

    def kill(self, reason: str) -> None:
        """End a hung worker; its exit is then reported with `reason`."""
        self.failure = self.failure or reason
        self._signal(signal.SIGKILL)

    def stop(self) -> None:
        """Stop the writer and make sure the process is gone (after a `finalize`, or instead of one)."""
        self.closing = True
        self._outbox.put(None)
        self._signal(signal.SIGKILL)
        self.proc.wait()

    def _signal(self, sig: int) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.send_signal(sig)
            except ProcessLookupError:
                pass

    def _read(self) -> None:
        try:
            while True:
                header, buffers = self.channel.receive()
                self._on_message(header, buffers)
        except (ChannelClosed, OSError):
            pass
        try:
            returncode = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:  # it closed the socket but lives on: no use to anyone
            self._signal(signal.SIGKILL)
            returncode = None
        self._outbox.put(None)
        if not self.closing:
            reason = self.failure or exit_reason(self.title, returncode)
            log.error("%s", reason)
            self._on_exit(reason)

    def _write(self) -> None:
        while (chunks := self._outbox.get()) is not None:
            try:
                for chunk in chunks:
                    self.channel.sock.sendall(chunk)
            except OSError:
                return  # the reader sees the same broken socket and reports the exit


def _kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        try:
            proc.kill()
        except ProcessLookupError:
            pass


def kill_and_close(proc: subprocess.Popen, channel: Channel) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    channel.close()
