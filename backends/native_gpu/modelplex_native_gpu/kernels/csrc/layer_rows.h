// The decoder layer's small ops on one token's row, for layer_ops.cpp's ops (their threads' rows) and
// dense_decode_step.cpp's one-region decode step (called directly on its threads' rows, without the dispatcher):
// one definition, compiled alike in each (-ffp-contract=off), so both give the same bits. The arithmetic and
// its roundings are layer_ops.cpp's (its header says which torch ops they reproduce).
#pragma once

#include <c10/util/BFloat16.h>

#include <cmath>
#include <cstdint>

#include "swiglu.h"

namespace modelplex_rows {

using modelplex_swiglu::bf16_to_float;
using modelplex_swiglu::float_to_bf16;
using modelplex_swiglu::round_bf16;

constexpr int64_t kLanes = 8;

// 1 / sqrt(mean(x^2) + eps) over an fp32 row, the sum in kLanes independent lanes (the compiler vectorizes it).
inline float inverse_rms(const float* x, int64_t n, double eps) {
  float partial[kLanes] = {0};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int64_t j = 0; j < kLanes; ++j) partial[j] += x[i + j] * x[i + j];
  }
  float sum = 0.f;
  for (int64_t j = 0; j < kLanes; ++j) sum += partial[j];
  for (; i < n; ++i) sum += x[i] * x[i];
  return 1.f / std::sqrt(sum / static_cast<float>(n) + static_cast<float>(eps));
}

// HF's LlamaRMSNorm on one row: weight * (x * rsqrt(mean(x^2) + eps)). xf: unused (bf16's scratch).
inline void rms_norm_row(const float* x, const float* weight, float* out, int64_t n, double eps,
                         float* /*xf*/ = nullptr) {
  const float scale = inverse_rms(x, n, eps);
  for (int64_t i = 0; i < n; ++i) out[i] = weight[i] * (x[i] * scale);
}

// rms_norm_row for bf16 rows: statistics in fp32 over the bf16 values, as RMSNorm.forward computes them.
// xf: n floats of scratch.
inline void rms_norm_row(const c10::BFloat16* x, const c10::BFloat16* weight, c10::BFloat16* out, int64_t n,
                         double eps, float* xf) {
  for (int64_t i = 0; i < n; ++i) xf[i] = bf16_to_float(x[i]);
  const float scale = inverse_rms(xf, n, eps);
  for (int64_t i = 0; i < n; ++i) xf[i] = round_bf16(bf16_to_float(weight[i]) * round_bf16(xf[i] * scale));
  for (int64_t i = 0; i < n; ++i) out[i] = float_to_bf16(xf[i]);
}

// residual += x, then x = RMSNorm(residual), on one row. xf: unused (fp32), n floats of scratch (bf16).
inline void add_rms_norm_row(float* x, float* residual, const float* weight, int64_t n, double eps, float* /*xf*/) {
  for (int64_t i = 0; i < n; ++i) residual[i] = residual[i] + x[i];
  rms_norm_row(residual, weight, x, n, eps, nullptr);
}

inline void add_rms_norm_row(c10::BFloat16* x, c10::BFloat16* residual, const c10::BFloat16* weight, int64_t n,
                             double eps, float* xf) {
  for (int64_t i = 0; i < n; ++i) xf[i] = round_bf16(bf16_to_float(residual[i]) + bf16_to_float(x[i]));
  for (int64_t i = 0; i < n; ++i) residual[i] = float_to_bf16(xf[i]);
  rms_norm_row(residual, weight, x, n, eps, xf);
}

// HF's rotate_half on one token's heads (head h at x + h * head_stride), in place: x1' = x1 * cos1 - x2 * sin1,
// x2' = x2 * cos2 + x1 * sin2 (halves of dim). c, s: the token's cos and sin [dim]. scratch: unused (fp32).
inline void rotate_row(float* x0, int64_t heads, int64_t head_stride, int64_t dim, const float* c, const float* s,
                       float* /*scratch*/) {
  const int64_t half = dim / 2;
  for (int64_t h = 0; h < heads; ++h) {
    float* x = x0 + h * head_stride;
    for (int64_t i = 0; i < half; ++i) {
      const float a = x[i], b = x[i + half];
      x[i] = a * c[i] + (-b) * s[i];
      x[i + half] = b * c[i + half] + a * s[i + half];
    }
  }
}

// bf16: every product and sum rounded to bf16 (cos/sin bf16, as the model's table). scratch: 3 dim floats.
inline void rotate_row(c10::BFloat16* x0, int64_t heads, int64_t head_stride, int64_t dim, const c10::BFloat16* c,
                       const c10::BFloat16* s, float* scratch) {
  const int64_t half = dim / 2;
  float *ct = scratch, *st = scratch + dim, *a = scratch + 2 * dim, *b = a + half;
  for (int64_t i = 0; i < dim; ++i) {
    ct[i] = bf16_to_float(c[i]);
    st[i] = bf16_to_float(s[i]);
  }
  for (int64_t h = 0; h < heads; ++h) {
    c10::BFloat16* x = x0 + h * head_stride;
    for (int64_t i = 0; i < half; ++i) {
      a[i] = bf16_to_float(x[i]);
      b[i] = bf16_to_float(x[i + half]);
    }
    for (int64_t i = 0; i < half; ++i) {
      a[i] = round_bf16(round_bf16(a[i] * ct[i]) + round_bf16(-b[i] * st[i]));
      b[i] = round_bf16(round_bf16(b[i] * ct[i + half]) + round_bf16(bf16_to_float(x[i]) * st[i + half]));
    }
    for (int64_t i = 0; i < half; ++i) {
      x[i] = float_to_bf16(a[i]);
      x[i + half] = float_to_bf16(b[i]);
    }
  }
}

}  // namespace modelplex_rows
