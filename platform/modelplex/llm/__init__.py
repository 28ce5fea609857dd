"""What every LLM backend and LLM front door share: the typed contract (`contract`: `TextChunk`s out of
`GenerateInputs`), the limits the data plane checks before any work (`limits`), and the KServe tensor
form of Triton's vLLM backend (`tensor_protocol`, `vllm_tensors`) adapted onto the contract
(`tensor_adapter`), so one backend serves the OpenAI routes, Triton's generate extension and gRPC alike.

Uses `core` and `models` (adapter names); never the data plane or a front door.
"""
