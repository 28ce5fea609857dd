// quant_gemm.cpp's entry points for quant_linear.cpp: the batched (GEMM) form of a quantized linear layer.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

namespace modelplex_quant_gemm {

// The batch size from which quant_linear hands a weight of GGML type `qtype` to quant_gemm_into (int64 max
// for types it does not handle): where it beats quant_linear.cpp's kernels (benchmarks/quant_gemm.py).
// MODELPLEX_QUANT_GEMM_MIN_TOKENS overrides it for every handled type (A/B measurements).
int64_t quant_gemm_min_tokens(int64_t qtype);

// tokens >= quant_gemm_min_tokens(qtype).
bool prefers_quant_gemm(int64_t qtype, int64_t tokens);

// y [M, N] (contiguous) = x [M, K] fp32 times data [N, row bytes] (ggml's blocks of `qtype`) transposed,
// + bias [N] where not null.
void quant_gemm_into(const at::Tensor& x, const at::Tensor& data, int64_t qtype, const float* bias, float* y);

}  // namespace modelplex_quant_gemm
