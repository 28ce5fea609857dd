"""Attention kernels: Triton for CUDA, with same-signature torch references that are also the CPU path."""
