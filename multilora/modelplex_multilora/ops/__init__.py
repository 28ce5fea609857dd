"""Batched LoRA shrink/expand: `reference` (torch), `cpu` (the same math on oneDNN-packed weights) and
`triton_lora` (CUDA), all with the same signatures."""
