// The decoder layer's small ops fused for the CPU path (vLLM's CPU backend fuses the same ones):
// RMSNorm with the residual add, and the rotary embedding, in place. One call where torch runs five to
// eight ops, each with its own dispatch and temporaries: at one token a step these were a fifth of it.
// Built with -ffp-contract=off: the rotation rounds each product and sum exactly as torch's ops do.
// fp32 and bf16; bf16 rounds where the torch ops it replaces (layers/norm.py, layers/rotary.py) round:
// the norm's statistics in fp32, x * rsqrt(...) rounded to bf16 before the weight multiplies it; each
// product and sum of the rotation rounded to bf16; the residual add rounded once. SwiGLU's silu(gate) * up in
// one pass over the gate_up projection's rows (fp32 and bf16).

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "layer_rows.h"
#include "swiglu.h"

#include <cstdint>
#include <type_traits>
#include <vector>

namespace {

using modelplex_rows::add_rms_norm_row;
using modelplex_rows::rms_norm_row;
using modelplex_rows::rotate_row;

bool is_float_or_bf16(const at::Tensor& t) {
  return t.scalar_type() == at::kFloat || t.scalar_type() == at::kBFloat16;
}

void check_rows(const at::Tensor& t, const at::Tensor& weight, const char* name) {
  TORCH_CHECK(is_float_or_bf16(t) && t.dim() == 2 && t.is_contiguous(), name,
              ": expected contiguous fp32 or bf16 [tokens, hidden]");
  TORCH_CHECK(weight.scalar_type() == t.scalar_type() && weight.dim() == 1 && weight.is_contiguous() &&
              weight.size(0) == t.size(1), "weight: expected [hidden] in the dtype of ", name);
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  check_rows(x, weight, "x");
  auto out = at::empty_like(x);
  const int64_t n = x.size(1);
  if (x.scalar_type() == at::kBFloat16) {
    const at::BFloat16 *in = x.data_ptr<at::BFloat16>(), *w = weight.data_ptr<at::BFloat16>();
    at::BFloat16* o = out.data_ptr<at::BFloat16>();
    at::parallel_for(0, x.size(0), 16, [&](int64_t begin, int64_t end) {
      std::vector<float> xf(n);
      for (int64_t t = begin; t < end; ++t) rms_norm_row(in + t * n, w, o + t * n, n, eps, xf.data());
    });
    return out;
  }
  const float *in = x.data_ptr<float>(), *w = weight.data_ptr<float>();
  float* o = out.data_ptr<float>();
  at::parallel_for(0, x.size(0), 16, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) rms_norm_row(in + t * n, w, o + t * n, n, eps);
  });
  return out;
}

// residual += x, then x = RMSNorm(residual): the layer's two adds and norms without temporaries.
void fused_add_rms_norm(at::Tensor x, at::Tensor residual, const at::Tensor& weight, double eps) {
  check_rows(x, weight, "x");
  check_rows(residual, weight, "residual");
  TORCH_CHECK(x.sizes() == residual.sizes(), "x and residual shapes differ");
  const int64_t n = x.size(1);
  if (x.scalar_type() == at::kBFloat16) {
    const at::BFloat16* w = weight.data_ptr<at::BFloat16>();
    at::BFloat16 *xs = x.data_ptr<at::BFloat16>(), *rs = residual.data_ptr<at::BFloat16>();
    at::parallel_for(0, x.size(0), 16, [&](int64_t begin, int64_t end) {
      std::vector<float> xf(n);
      for (int64_t t = begin; t < end; ++t) add_rms_norm_row(xs + t * n, rs + t * n, w, n, eps, xf.data());
    });
    return;
  }
  const float* w = weight.data_ptr<float>();
  float *xs = x.data_ptr<float>(), *rs = residual.data_ptr<float>();
  at::parallel_for(0, x.size(0), 16, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) add_rms_norm_row(xs + t * n, rs + t * n, w, n, eps, nullptr);
  });
}

// HF's rotate_half convention, in place on [tokens, heads, head_dim] (heads may be a strided slice); cos/sin:
// [tokens, head_dim]. bf16: every product and sum rounded to bf16 (layer_rows.h).
template <typename T>
void rotate_rows(at::Tensor qk, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t tokens = qk.size(0), heads = qk.size(1), dim = qk.size(2);
  const T *c = cos.data_ptr<T>(), *s = sin.data_ptr<T>();
  T* base = qk.data_ptr<T>();
  const int64_t token_stride = qk.stride(0), head_stride = qk.stride(1);
  at::parallel_for(0, tokens, 16, [&](int64_t begin, int64_t end) {
    std::vector<float> scratch(std::is_same_v<T, float> ? 0 : 3 * dim);  // bf16's
    for (int64_t t = begin; t < end; ++t) {
      rotate_row(base + t * token_stride, heads, head_stride, dim, c + t * dim, s + t * dim, scratch.data());
    }
  });
}

void rotary_embedding(at::Tensor qk, const at::Tensor& cos, const at::Tensor& sin) {
  TORCH_CHECK(is_float_or_bf16(qk) && qk.dim() == 3 && qk.stride(2) == 1,
              "qk: expected fp32 or bf16 [tokens, heads, head_dim]");
  const int64_t tokens = qk.size(0), dim = qk.size(2);
  TORCH_CHECK(dim % 2 == 0, "head_dim must be even");
  for (const auto* t : {&cos, &sin}) {
    TORCH_CHECK(t->scalar_type() == qk.scalar_type() && t->is_contiguous() && t->numel() == tokens * dim,
                "cos/sin: expected contiguous [tokens, head_dim] in the dtype of qk");
  }
  if (qk.scalar_type() == at::kBFloat16) return rotate_rows<at::BFloat16>(qk, cos, sin);
  rotate_rows<float>(qk, cos, sin);
}

at::Tensor silu_and_mul(const at::Tensor& gate_up) {
  TORCH_CHECK(is_float_or_bf16(gate_up) && gate_up.dim() == 2 && gate_up.is_contiguous() && gate_up.size(1) % 2 == 0,
              "gate_up: expected contiguous fp32 or bf16 [tokens, 2 * intermediate]");
  const int64_t tokens = gate_up.size(0), n = gate_up.size(1) / 2;
  auto out = at::empty({tokens, n}, gate_up.options());
  if (gate_up.scalar_type() == at::kFloat) {
    modelplex_swiglu::silu_and_mul_f32(gate_up.data_ptr<float>(), out.data_ptr<float>(), tokens, n);
    return out;
  }
  modelplex_swiglu::silu_and_mul_bf16(gate_up.data_ptr<at::BFloat16>(), out.data_ptr<at::BFloat16>(), tokens, n);
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(modelplex_cpu, m) {
  m.def("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor");
  m.def("fused_add_rms_norm(Tensor(a!) x, Tensor(b!) residual, Tensor weight, float eps) -> ()");
  m.def("rotary_embedding(Tensor(a!) qk, Tensor cos, Tensor sin) -> ()");
  m.def("silu_and_mul(Tensor gate_up) -> Tensor");
}

TORCH_LIBRARY_IMPL(modelplex_cpu, CPU, m) {
  m.impl("rms_norm", &rms_norm);
  m.impl("fused_add_rms_norm", &fused_add_rms_norm);
  m.impl("rotary_embedding", &rotary_embedding);
  m.impl("silu_and_mul", &silu_and_mul);
}
