"""Our OTLP encoder against the OpenTelemetry SDK's: the same spans give the same protobuf message."""
from __future__ import annotations

import random

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from modelplex.observability.otlp_encoding import SpanEncoder, varint
from modelplex.observability.otlp_exporter import resource_and_scope
from modelplex.observability.trace_export import readable_span
from modelplex.observability.trace_spans import expand_children

TRACE_ID = 0x4BF92F3577B34DA6A3CE929D0E0E4736
T0 = 1_763_000_000_000_000_000
SPANS = [
    # a server span under a client's remote parent, with tracestate, an error status and every value type
    (TRACE_ID, 0x1111, 0x00F067AA0BA902B7, True, "vendor=abc,other=1", "POST /v2/models/simple/infer", 2, T0,
     T0 + 150_000, {"model": "simple", "http.response.status_code": 500, "ok": False, "ratio": 0.25,
                    "negative": -3, "big": 2**62, "shape": [1, 16], "names": ["a", "b"]},
     None, 2, "InternalError: boom"),
    # an internal child with events (one without attributes) and no status
    (TRACE_ID, 0x2222, 0x1111, False, "vendor=abc,other=1", "stream smollm2", 1, T0 + 10, T0 + 90_000,
     {"model": "smollm2"}, [(T0 + 20, "response", {"index": 0, "elapsed_ms": 12.5}), (T0 + 30, "done", {})],
     0, ""),
    # a root span of a new trace (no parent), a non-ASCII name, an OK status
    (0xABCDEF, 0xFFFFFFFFFFFFFFFF, 0, False, "", "étape 1", 1, T0, T0 + 1, {}, None, 1, ""),
]


def test_our_encoding_equals_the_sdks():
    attributes = {"service.name": "test-modelplex"}
    resource, scope = Resource.create(attributes), InstrumentationScope("modelplex")
    expected = encode_spans([readable_span(s, resource, scope) for s in SPANS])
    ours = ExportTraceServiceRequest.FromString(SpanEncoder(*resource_and_scope(attributes)).encode(SPANS))
    assert ours == expected, f"ours:\n{ours}\nSDK's:\n{expected}"
    # Cached names and attributes give the same bytes the second time.
    encoder = SpanEncoder(*resource_and_scope(attributes))
    assert encoder.encode(SPANS) == encoder.encode(SPANS)


SHARED = {"model": "simple"}  # one dict in several spans, as a server shares a path's attributes
WITH_CHILDREN = [
    # a request as the HTTP front door records it: the model's record with the queue/compute pair,
    # a backend phase that starts before its parent (clamped), and the same attributes on another
    # request that failed (tails that differ only by status code or message)
    (TRACE_ID, 0x1111, 0, False, "", "POST /v2/models/simple/infer", 2, T0, T0 + 150_000, SHARED, None, 0, "",
     [("simple", T0 + 10, T0 + 140_000, SHARED, 0, "", [(None, T0 + 20, T0 + 30, T0 + 130_000, 4)]),
      ("prefill", T0 - 5, T0 + 50, {"tokens": 7})]),
    (TRACE_ID + 1, 0x3333, 0x00F067AA0BA902B7, True, "k=v", "POST /v2/models/simple/infer", 2, T0, T0 + 9, SHARED,
     None, 2, "InternalError: boom",
     [("simple", T0 + 1, T0 + 8, SHARED, 2, "boom", [(None, T0 + 2, T0 + 3, T0 + 7, 1)]),
      ("simple", T0 + 1, T0 + 8, SHARED, 2, "other", None)]),
    SPANS[2] + (None,),  # no children
]


def test_children_encode_as_the_sdk_encodes_them_expanded():
    # Child span ids are random: the same seed gives both paths the same ids, in the same order.
    attributes = {"service.name": "test-modelplex"}
    resource, scope = Resource.create(attributes), InstrumentationScope("modelplex")
    random.seed(7)
    expected = encode_spans([readable_span(s, resource, scope) for s in expand_children(WITH_CHILDREN)])
    random.seed(7)
    encoder = SpanEncoder(*resource_and_scope(attributes))
    fields = encoder.span_fields(WITH_CHILDREN)
    assert len(fields) == 5 + 5 + 1
    ours = ExportTraceServiceRequest.FromString(encoder.request(fields))
    assert ours == expected, f"ours:\n{ours}\nSDK's:\n{expected}"


def test_varint_boundaries():
    for n in (0, 1, 127, 128, 300, 2**32, 2**64 - 1):
        decoded, shift = 0, 0
        for byte in varint(n):
            decoded |= (byte & 0x7F) << shift
            shift += 7
        assert decoded == n


def test_the_collector_address_follows_opentelemetrys_environment():
    from modelplex.core.trace_config import default_otlp_url

    assert default_otlp_url({}) == "http://localhost:4318/v1/traces"
    assert default_otlp_url({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://otel:4318/"}) == "http://otel:4318/v1/traces"
    assert default_otlp_url({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://otel:4318",
                             "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://t:9/x"}) == "http://t:9/x"
