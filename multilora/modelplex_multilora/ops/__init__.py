"""Batched LoRA shrink/expand: `reference` (torch, one-hot over slots), `cpu` (tokens grouped by adapter,
batched matmuls) and `triton_lora` (CUDA), all with the same signatures."""
