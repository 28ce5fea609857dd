"""What the server tells operators: per-model statistics, Prometheus metrics (Triton's and vLLM's
families, host gauges), request tracing (spans recorded on the request path, exported by a separate
process as OTLP) and logging.

Uses `core` only; the layers above report into it, it never calls them.
"""
