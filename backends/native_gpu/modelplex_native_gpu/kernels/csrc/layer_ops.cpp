// The decoder layer's small fp32 ops fused for the CPU path (vLLM's CPU backend fuses the same ones):
// RMSNorm with the residual add, and the rotary embedding, in place. One call where torch runs five to
// eight ops, each with its own dispatch and temporaries: at one token a step these were a fifth of it.
// Built with -ffp-contract=off: the rotation rounds each product and sum exactly as torch's ops do.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cmath>

namespace {

constexpr int64_t kLanes = 8;

// HF's LlamaRMSNorm on one row: weight * (x * rsqrt(mean(x^2) + eps)).
inline void rms_norm_row(const float* x, const float* weight, float* out, int64_t n, double eps) {
  float partial[kLanes] = {0};  // independent lanes: the compiler vectorizes this loop
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int64_t j = 0; j < kLanes; ++j) partial[j] += x[i + j] * x[i + j];
  }
  float sum = 0.f;
  for (int64_t j = 0; j < kLanes; ++j) sum += partial[j];
  for (; i < n; ++i) sum += x[i] * x[i];
  const float scale = 1.f / std::sqrt(sum / static_cast<float>(n) + static_cast<float>(eps));
  for (i = 0; i < n; ++i) out[i] = weight[i] * (x[i] * scale);
}

void check_rows(const at::Tensor& t, const at::Tensor& weight, const char* name) {
  TORCH_CHECK(t.scalar_type() == at::kFloat && t.dim() == 2 && t.is_contiguous(), name, ": expected contiguous fp32 [tokens, hidden]");
  TORCH_CHECK(weight.scalar_type() == at::kFloat && weight.dim() == 1 && weight.is_contiguous() && weight.size(0) == t.size(1),
              "weight: expected fp32 [hidden]");
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  check_rows(x, weight, "x");
  auto out = at::empty_like(x);
  const int64_t n = x.size(1);
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
  const float* w = weight.data_ptr<float>();
  float *xs = x.data_ptr<float>(), *rs = residual.data_ptr<float>();
  at::parallel_for(0, x.size(0), 16, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      float* r = rs + t * n;
      float* row = xs + t * n;
      for (int64_t i = 0; i < n; ++i) r[i] = r[i] + row[i];
      rms_norm_row(r, w, row, n, eps);
    }
  });
}

// HF's rotate_half convention, in place on [tokens, heads, head_dim] (heads may be a strided slice):
// x1' = x1 * cos1 - x2 * sin1, x2' = x2 * cos2 + x1 * sin2 (halves of head_dim). cos/sin: [tokens, head_dim].
void rotary_embedding(at::Tensor qk, const at::Tensor& cos, const at::Tensor& sin) {
  TORCH_CHECK(qk.scalar_type() == at::kFloat && qk.dim() == 3 && qk.stride(2) == 1, "qk: expected fp32 [tokens, heads, head_dim]");
  const int64_t tokens = qk.size(0), heads = qk.size(1), dim = qk.size(2), half = dim / 2;
  TORCH_CHECK(dim % 2 == 0, "head_dim must be even");
  for (const auto* t : {&cos, &sin}) {
    TORCH_CHECK(t->scalar_type() == at::kFloat && t->is_contiguous() && t->numel() == tokens * dim,
                "cos/sin: expected contiguous fp32 [tokens, head_dim]");
  }
  const float *c = cos.data_ptr<float>(), *s = sin.data_ptr<float>();
  float* base = qk.data_ptr<float>();
  const int64_t token_stride = qk.stride(0), head_stride = qk.stride(1);
  at::parallel_for(0, tokens, 16, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const float *ct = c + t * dim, *st = s + t * dim;
      for (int64_t h = 0; h < heads; ++h) {
        float* x = base + t * token_stride + h * head_stride;
        for (int64_t i = 0; i < half; ++i) {
          const float a = x[i], b = x[i + half];
          x[i] = a * ct[i] + (-b) * st[i];
          x[i + half] = b * ct[i + half] + a * st[i + half];
        }
      }
    }
  });
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(modelplex_cpu, m) {
  m.def("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor");
  m.def("fused_add_rms_norm(Tensor(a!) x, Tensor(b!) residual, Tensor weight, float eps) -> ()");
  m.def("rotary_embedding(Tensor(a!) qk, Tensor cos, Tensor sin) -> ()");
}

TORCH_LIBRARY_IMPL(modelplex_cpu, CPU, m) {
  m.impl("rms_norm", &rms_norm);
  m.impl("fused_add_rms_norm", &fused_add_rms_norm);
  m.impl("rotary_embedding", &rotary_embedding);
}
