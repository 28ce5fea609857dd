"""The gRPC front door: Triton's `inference.GRPCInferenceService` and `grpc.health.v1.Health` over the DataPlane."""
