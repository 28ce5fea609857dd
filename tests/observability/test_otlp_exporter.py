"""The exporter process (`python -m modelplex.observability.otlp_exporter`) against a real OTLP/HTTP receiver."""
from __future__ import annotations

import marshal
import subprocess
import sys

from helpers.otlp_receiver import receiver

from modelplex.observability.trace_spans import new_recorder, share


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
