"""Multi-LoRA: PEFT adapters over one base model, swapped at run time, mixed in one batch.

The contract with the host (backend-neutral; modelplex/adapters.py): a `ModelInstance` that serves
adapters implements `load_adapter(name, path)`, `unload_adapter(name)` (returns once the adapter's
running requests finished) and `list_adapters()`; the host has already checked the name (like a model
name, unique across models and adapters) and confined `path` to `--lora-adapter-root` folders or the
model's `adapters/`; a request names its adapter in the parameter `lora`. This package holds what any
backend needs to serve them: `peft.read_adapter` checks a PEFT folder against the base model's shapes
(rank <= max_lora_rank, target modules, alpha / rsLoRA scaling) before any weight is read.
"""
from .peft import AdapterSpec, BaseModelShape, InvalidAdapterError, read_adapter

__all__ = ["AdapterSpec", "BaseModelShape", "InvalidAdapterError", "read_adapter"]
