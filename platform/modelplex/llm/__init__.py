"""What every LLM backend and LLM front door share: the tensor protocol of text-generation models
(Triton's vLLM-backend tensors, extended), so one backend serves the OpenAI routes, Triton's generate
extension and gRPC streaming alike.

Uses `core` and `models` (adapter names); never the data plane or a front door.
"""
