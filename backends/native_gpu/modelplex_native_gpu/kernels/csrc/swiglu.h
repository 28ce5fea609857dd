// SwiGLU's silu(gate) * up in fp32 with a vector exp, for the ops that compute it: layer_ops.cpp's
// silu_and_mul (the fp32 and bf16 MLPs), quant_linear.cpp's quant_silu_mlp and decode_step.cpp's whole-step
// decode, which must give the same bits as the layer op by op: one definition, compiled alike in each.
// torch's fp32 silu computes the same formula with Sleef's expf: results may differ in the last bits.
#pragma once

#include <ATen/Parallel.h>

#include <cmath>
#include <cstdint>

#ifdef __AVX512F__
#include <immintrin.h>
#endif

#include "vec_exp.h"

namespace modelplex_swiglu {

#ifdef __AVX512F__
// exp(x) = 2^k * exp(r), k = round(x / ln 2), r = x - k ln 2 (ln 2 in two parts, Cody-Waite: r exact),
// |r| <= ln 2 / 2; exp(r) by Cephes expf's minimax polynomial; 2^k by scalef (inf past the range, 0 and the
// denormals below it). x is clamped to [-104, 89] first (exp is 0 and inf in float there), so r stays small.
// Against float64 on every float in [-103.9, 88.72]: at most 1.26 ulps (normal results; 0.78 for denormal
// ones). silu(g) * u below adds three roundings: tests/native_gpu/test_cpu_layer_ops.py bounds it by 3 ulps.
inline __m512 exp_ps(__m512 x) {
  __m512 k;
  const __m512 y = modelplex_vec::exp_reduced(
      _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-104.f)), _mm512_set1_ps(89.f)), k);
  return _mm512_scalef_ps(y, k);
}

// silu(g) * u = g / (1 + exp(-g)) * u, each operation rounded once in fp32 (torch's silu: the same formula).
inline __m512 silu_mul_ps(__m512 g, __m512 u) {
  const __m512 e = exp_ps(_mm512_sub_ps(_mm512_setzero_ps(), g));
  return _mm512_mul_ps(_mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.f), e)), u);
}

#endif

// rows [tokens, 2n] (gate, then up, as gate_up_proj writes them) -> o [tokens, n].
inline void silu_and_mul_f32(const float* in, float* o, int64_t tokens, int64_t n) {
  at::parallel_for(0, tokens, 4, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const float *g = in + t * 2 * n, *u = g + n;
      float* row = o + t * n;
      int64_t i = 0;
#ifdef __AVX512F__
      for (; i + 16 <= n; i += 16) _mm512_storeu_ps(row + i, silu_mul_ps(_mm512_loadu_ps(g + i), _mm512_loadu_ps(u + i)));
      if (i < n) {
        const __mmask16 tail = static_cast<__mmask16>((1u << (n - i)) - 1);
        _mm512_mask_storeu_ps(row + i, tail, silu_mul_ps(_mm512_maskz_loadu_ps(tail, g + i), _mm512_maskz_loadu_ps(tail, u + i)));
        i = n;
      }
#endif
      for (; i < n; ++i) row[i] = g[i] / (1.f + std::exp(-g[i])) * u[i];
    }
  });
}

}  // namespace modelplex_swiglu
