"""Multi-LoRA: PEFT adapters over one base model, swapped at run time, mixed in one batch (not built yet)."""
