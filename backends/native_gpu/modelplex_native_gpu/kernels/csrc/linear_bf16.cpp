// bf16 linear layers for the CPU path, on CPUs with AVX512_BF16 (vdpbf16ps): y = x W^T (+ bias) on a weight
// packed once into column panels of k pairs, [ceil(N / kPanel)][ceil(K / 2)][kPanel][2] (for each pair of k,
// the panel's kPanel output columns side by side, each column's two k adjacent: one 64-byte register holds 16
// columns' pairs, what vdpbf16ps multiplies with a broadcast pair of one token's x). Zero columns and a zero
// k pad the last panel and an odd K. The products of bf16 values are exact in fp32 and accumulate in fp32;
// the output is rounded to bf16 once (or kept fp32 where the caller asks). As in linear.cpp, one layout serves
// every batch size (a one-token step streams the weight once, a many-token step runs register tiles of kRows
// tokens x kPanel columns), and each output is one chain over the k pairs in order, whatever the batch, so a
// token's outputs do not depend on the tokens batched with it. oneDNN's packed bf16 weights, which this
// replaces, cost ~11 us a call in dispatch at SmolLM2's sizes, 121 calls a step.
//
// Built only where the compiler targets AVX512_BF16 (-march=native on such a CPU); elsewhere the ops are not
// registered and layers/linear.py keeps oneDNN.
#if defined(__AVX512BF16__) && defined(__AVX512F__)
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <optional>

#include "linear_bf16_panels.h"

namespace {

using modelplex_linear_bf16::kPanel;

template <typename T>
void run(const uint16_t* xs, int64_t M, int64_t ldx, const uint16_t* ws, int64_t panels, int64_t K2,
         const float* b, T* ys, int64_t N) {
  at::parallel_for(0, panels, 1, [&](int64_t p0, int64_t p1) {
    modelplex_linear_bf16::linear_panels(xs, M, ldx, ws, K2, b, ys, N, p0, p1);
  });
}

// weight [out_features, in_features], bf16 (or fp32, rounded to bf16) -> [panels, ceil(K / 2), kPanel, 2] bf16.
at::Tensor pack_linear_weight_bf16(const at::Tensor& weight) {
  TORCH_CHECK(weight.dim() == 2 && (weight.scalar_type() == at::kBFloat16 || weight.scalar_type() == at::kFloat),
              "weight: expected bf16 or fp32 [out_features, in_features]");
  const int64_t N = weight.size(0), K = weight.size(1), panels = (N + kPanel - 1) / kPanel, K2 = (K + 1) / 2;
  auto padded = at::zeros({panels * kPanel, K2 * 2}, weight.options().dtype(at::kBFloat16));
  padded.narrow(0, 0, N).narrow(1, 0, K).copy_(weight);
  return padded.view({panels, kPanel, K2, 2}).permute({0, 2, 1, 3}).contiguous();
}

// x [M, K] bf16 (fp32 is rounded to bf16 first), rows may be strided; packed from pack_linear_weight_bf16;
// bias bf16 or fp32 [out_features]; returns [M, out_features] in out_dtype (bf16 unless fp32 is asked for).
at::Tensor packed_linear_bf16(const at::Tensor& x, const at::Tensor& packed, int64_t out_features,
                              const std::optional<at::Tensor>& bias, std::optional<at::ScalarType> out_dtype) {
  TORCH_CHECK(x.dim() == 2 && (x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kFloat),
              "x: expected bf16 or fp32 [tokens, in_features]");
  const int64_t M = x.size(0), K = x.size(1), N = out_features, K2 = (K + 1) / 2;
  TORCH_CHECK(packed.scalar_type() == at::kBFloat16 && packed.dim() == 4 && packed.size(2) == kPanel &&
              packed.size(3) == 2 && packed.is_contiguous() && packed.size(1) == K2 && packed.size(0) * kPanel >= N &&
              (packed.size(0) - 1) * kPanel < N,
              "packed: not a weight packed for this input by pack_linear_weight_bf16");
  const auto dtype = out_dtype.value_or(at::kBFloat16);
  TORCH_CHECK(dtype == at::kBFloat16 || dtype == at::kFloat, "out_dtype: expected bfloat16 or float32");
  at::Tensor xb = x.scalar_type() == at::kBFloat16 ? x : x.to(at::kBFloat16);
  if (K % 2 != 0) {
    xb = at::constant_pad_nd(xb, {0, 1});  // the pad pairs with the packed zero k: a pair read never crosses a row
  } else if (xb.stride(1) != 1) {
    xb = xb.contiguous();
  }
  at::Tensor b;
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->dim() == 1 && bias->numel() == N &&
                (bias->scalar_type() == at::kBFloat16 || bias->scalar_type() == at::kFloat),
                "bias: expected bf16 or fp32 [out_features]");
    b = at::zeros({packed.size(0) * kPanel}, x.options().dtype(at::kFloat));  // the last panel's tiles read kPanel
    b.narrow(0, 0, N).copy_(*bias);
  }
  auto out = at::empty({M, N}, x.options().dtype(dtype));
  if (M == 0) return out;
  const auto* xs = reinterpret_cast<const uint16_t*>(xb.data_ptr<at::BFloat16>());
  const auto* ws = reinterpret_cast<const uint16_t*>(packed.data_ptr<at::BFloat16>());
  const float* bs = b.defined() ? b.data_ptr<float>() : nullptr;
  const int64_t ldx = M == 1 ? 0 : xb.stride(0);
  if (dtype == at::kFloat) {
    run(xs, M, ldx, ws, packed.size(0), K2, bs, out.data_ptr<float>(), N);
  } else {
    run(xs, M, ldx, ws, packed.size(0), K2, bs, reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>()), N);
  }
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(modelplex_cpu, m) {
  m.def("pack_linear_weight_bf16(Tensor weight) -> Tensor");
  m.def("packed_linear_bf16(Tensor x, Tensor packed, int out_features, Tensor? bias, ScalarType? out_dtype=None) -> Tensor");
}

TORCH_LIBRARY_IMPL(modelplex_cpu, CPU, m) {
  m.impl("pack_linear_weight_bf16", &pack_linear_weight_bf16);
  m.impl("packed_linear_bf16", &packed_linear_bf16);
}
#endif  // __AVX512BF16__
