"""The HTTP front door: KServe v2 in Triton's dialect (JSON and binary tensors, Triton's extensions),
a thin translator over the data plane; plugins' access checks applied before any route runs.

Uses the data plane and the layers below it; never the gRPC door, the OpenAI routes or the server
assembly (which mounts those routers on this door's app).
"""
