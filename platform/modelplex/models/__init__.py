"""Models on disk and in memory: repositories and names, Triton's `config.pbtxt` (parse, complete,
validate), LoRA adapter sets, the model manager (load, unload, reload, poll) and one loaded
version's request path through its instances.

Uses `core`, `scheduling` and `observability`; never the data plane, the LLM helpers, a front door
or the server assembly, and never a web or RPC framework.
"""
