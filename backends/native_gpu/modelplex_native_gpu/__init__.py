"""modelplex_native_gpu: a paged-attention LLM engine (Llama family) with Triton kernels for CUDA and a torch
path for CPU."""
