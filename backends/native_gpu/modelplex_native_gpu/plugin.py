"""Declares the `native_gpu` LLM backend to modelplex; torch and the engine load only with a model.

Weights: `<version>/model.gguf` or `<version>/` as an HF folder (config.json + safetensors).
Engine settings come from config.pbtxt `parameters` (EngineConfig field names, plus
`max_queue_size`). Tensors follow Triton's vLLM backend, extended (see protocol.py): `text_input`
or `messages`, optional `sampling_parameters` in; `text_output` out. Decoupled models stream
text deltas; others return the whole text. Instances report their occupancy (`engine_stats`:
running and waiting requests, free KV blocks) and the host's `vllm:*` metric family (`llm_metrics`).
"""
from __future__ import annotations

import os

from modelplex import BackendSpec, InstanceContext, ModelContext, ModelInstance, hookimpl

MAX_CONCURRENCY = 256  # the engine batches internally; the host may hand it this many requests

# oneDNN's primitive cache and torch's ideep cache each keep the kernels of up to 1,024 matmul shapes,
# and every distinct token count of an engine step is a new shape: a server's memory grew for hours
# (~230 MB for 400 shapes of one linear). 16 each holds the few shapes a step reuses across layers;
# throughput was unchanged. Both are read once per process, at the first matmul, so they are set here,
# at plugin discovery, before any model loads (an operator's own values win). OpenVINO's oneDNN reads
# the first variable too: its benchmarks (benchmarks/openvino.py) were unchanged with it.
os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "16")
os.environ.setdefault("LRU_CACHE_CAPACITY", "16")


def _create_instance(ictx: InstanceContext) -> ModelInstance:
    from .serving import LLMInstance

    return LLMInstance(ictx)


def _auto_complete_config(ctx: ModelContext) -> None:
    from .serving import auto_complete_config

    auto_complete_config(ctx)


@hookimpl
def modelplex_backends():
    return [BackendSpec(name="native_gpu", aliases=("vllm",), default_model_filename="model.gguf",
                        create_instance=_create_instance, auto_complete_config=_auto_complete_config,
                        max_concurrency_per_instance=MAX_CONCURRENCY)]
