"""Batched LoRA shrink/expand: `reference` (torch; the CPU path) and `triton_lora` (CUDA), same signatures."""
