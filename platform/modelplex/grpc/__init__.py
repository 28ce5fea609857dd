"""The gRPC front door: Triton's `inference.GRPCInferenceService` and `grpc.health.v1.Health`, a thin
translator over the data plane; plugins' access checks and TLS records applied here.

Uses the data plane and the layers below it; never the HTTP door, the OpenAI routes or the server
assembly.
"""
