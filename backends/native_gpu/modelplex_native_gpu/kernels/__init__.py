"""Attention kernels: Triton for CUDA; torch references of the same signatures; the CPU path (references + a C++
decode op)."""
