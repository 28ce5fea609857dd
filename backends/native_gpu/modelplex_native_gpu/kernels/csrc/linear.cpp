// fp32 linear layers for the CPU path: y = x W^T (+ bias) on a weight packed once into column panels,
// [ceil(N / kPanel)][K][kPanel] (the panel's kPanel output columns side by side for each k; zero rows pad
// the last one). One layout serves every batch size: a decode step at one token streams the weight once
// at memory speed, a 64-token step runs register-tiled (kRows tokens x kPanel columns) at the FMA units'
// rate. oneDNN's packed weights (what this replaced) cost ~11 us a call in dispatch at one token, 121
// calls a SmolLM2 step. Every output is one FMA chain over k in order, whatever the batch size, so a
// token's outputs do not depend on the tokens batched with it.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <optional>

#include "linear_panels.h"

namespace {

at::Tensor pack_linear_weight(const at::Tensor& weight) {
  TORCH_CHECK(weight.scalar_type() == at::kFloat && weight.dim() == 2, "weight: expected fp32 [out_features, in_features]");
  const int64_t N = weight.size(0), K = weight.size(1), panels = (N + kPanel - 1) / kPanel;
  auto padded = at::zeros({panels * kPanel, K}, weight.options());
  padded.narrow(0, 0, N).copy_(weight);
  return padded.view({panels, kPanel, K}).transpose(1, 2).contiguous();
}

// x [M, K] fp32; packed from pack_linear_weight; returns [M, out_features].
at::Tensor packed_linear(const at::Tensor& x, const at::Tensor& packed, int64_t out_features,
                         const std::optional<at::Tensor>& bias) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.dim() == 2, "x: expected fp32 [tokens, in_features]");
  TORCH_CHECK(packed.scalar_type() == at::kFloat && packed.dim() == 3 && packed.size(2) == kPanel && packed.is_contiguous() &&
              packed.size(1) == x.size(1) && packed.size(0) * kPanel >= out_features,
              "packed: not a weight packed for this input by pack_linear_weight");
  const auto xc = x.contiguous();
  const int64_t M = x.size(0), K = x.size(1), N = out_features, panels = packed.size(0);
  const float* b = nullptr;
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->is_contiguous() && bias->numel() == N, "bias: expected fp32 [out_features]");
    b = bias->data_ptr<float>();
  }
  auto out = at::empty({M, N}, x.options());
  const float* xs = xc.data_ptr<float>();
  const float* ws = packed.data_ptr<float>();
  float* ys = out.data_ptr<float>();
  at::parallel_for(0, panels, 1, [&](int64_t p0, int64_t p1) { linear_panels(xs, M, K, ws, N, b, ys, p0, p1); });
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(modelplex_cpu, m) {
  m.def("pack_linear_weight(Tensor weight) -> Tensor");
  m.def("packed_linear(Tensor x, Tensor packed, int out_features, Tensor? bias) -> Tensor");
}

TORCH_LIBRARY_IMPL(modelplex_cpu, CPU, m) {
  m.impl("pack_linear_weight", &pack_linear_weight);
  m.impl("packed_linear", &packed_linear);
}
