// SwiGLU's silu(gate) * up in fp32 with a vector exp, for the ops that compute it: layer_ops.cpp's
// silu_and_mul (the fp32 and bf16 MLPs), quant_linear.cpp's quant_silu_mlp, decode_step.cpp's and
// dense_layer.cpp's whole-step decodes, which must give the same bits as the layer op by op: one definition,
// compiled alike in each. With it the bf16 rounding helpers layer_ops.cpp's bf16 ops share.
// torch's fp32 silu computes the same formula with Sleef's expf: results may differ in the last bits.
#pragma once

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#ifdef __AVX512F__
#include <immintrin.h>
#endif

#include "vec_exp.h"

namespace modelplex_swiglu {

// x rounded to the nearest bf16 (ties to even), as a float: what torch's bf16 ops store. NaN stays NaN.
inline float round_bf16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  const uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u;
  u = (u & 0x7FFFFFFFu) > 0x7F800000u ? (u | 0x00400000u) & 0xFFFF0000u : rounded;
  std::memcpy(&x, &u, 4);
  return x;
}

inline float bf16_to_float(c10::BFloat16 x) {
  const uint32_t u = static_cast<uint32_t>(x.x) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// The top half of a float already rounded by round_bf16.
inline c10::BFloat16 float_to_bf16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return c10::BFloat16(static_cast<uint16_t>(u >> 16), c10::BFloat16::from_bits());
}

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

// o[t][0:n] = silu(g[t][0:n]) * u[t][0:n] for tokens t in [begin, end) (rows of g and u ld_in apart, of o ld_out):
// each value by the same arithmetic whatever the rows and columns a call covers.
inline void silu_and_mul_rows_f32(const float* g0, const float* u0, int64_t ld_in, float* o, int64_t ld_out,
                                  int64_t begin, int64_t end, int64_t n) {
  for (int64_t t = begin; t < end; ++t) {
    const float *g = g0 + t * ld_in, *u = u0 + t * ld_in;
    float* row = o + t * ld_out;
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
}

// rows [tokens, 2n] (gate, then up, as gate_up_proj writes them) -> o [tokens, n].
inline void silu_and_mul_f32(const float* in, float* o, int64_t tokens, int64_t n) {
  at::parallel_for(0, tokens, 4, [&](int64_t begin, int64_t end) {
    silu_and_mul_rows_f32(in, in + n, 2 * n, o, n, begin, end, n);
  });
}

// SwiGLU on bf16 rows [tokens, 2n] (gate, then up, as gate_up_proj writes them) -> [tokens, n]:
// round_bf16(round_bf16(g / (1 + exp(-g))) * u), where F.silu(gate).mul_(up) rounds. torch's exp is
// Sleef's (1 ulp), ours below a degree-6 polynomial (2 ulps): the bf16 results can differ only where the
// fp32 silu sits within those ulps of a bf16 rounding boundary.
inline float silu_mul_scalar(float g, float u) {
  return round_bf16(round_bf16(g / (1.f + std::exp(-g))) * u);
}

#ifdef __AVX512F__
inline __m512 load_bf16(const c10::BFloat16* x) {
  const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
}

// Round to nearest even, as round_bf16 (the quiet NaNs silu produces stay NaN).
inline __m512 round_bf16_ps(__m512 x) {
  const __m512i u = _mm512_castps_si512(x);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7FFF)), odd);
  return _mm512_castsi512_ps(_mm512_and_si512(rounded, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u))));
}

inline void store_bf16(c10::BFloat16* out, __m512 x) {  // x already rounded: its top halves
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(x), 16)));
}
#endif

// silu_and_mul_rows_f32 on bf16 rows. The last n % 16 columns take a scalar exp (on AVX512 too): calls that split
// a row's columns give the same bits where they split at multiples of 16.
inline void silu_and_mul_rows_bf16(const c10::BFloat16* g0, const c10::BFloat16* u0, int64_t ld_in, c10::BFloat16* o,
                                   int64_t ld_out, int64_t begin, int64_t end, int64_t n) {
  for (int64_t t = begin; t < end; ++t) {
    const c10::BFloat16 *g = g0 + t * ld_in, *u = u0 + t * ld_in;
    c10::BFloat16* row = o + t * ld_out;
    int64_t i = 0;
#ifdef __AVX512F__
    const __m512 one = _mm512_set1_ps(1.f);
    for (; i + 16 <= n; i += 16) {
      const __m512 gv = load_bf16(g + i);
      const __m512 silu = round_bf16_ps(_mm512_div_ps(gv, _mm512_add_ps(one, exp_ps(_mm512_sub_ps(_mm512_setzero_ps(), gv)))));
      store_bf16(row + i, round_bf16_ps(_mm512_mul_ps(silu, load_bf16(u + i))));
    }
#endif
    for (; i < n; ++i) row[i] = float_to_bf16(silu_mul_scalar(bf16_to_float(g[i]), bf16_to_float(u[i])));
  }
}

// bf16 rows [tokens, 2n] -> o [tokens, n].
inline void silu_and_mul_bf16(const c10::BFloat16* in, c10::BFloat16* o, int64_t tokens, int64_t n) {
  at::parallel_for(0, tokens, 4, [&](int64_t begin, int64_t end) {
    silu_and_mul_rows_bf16(in, in + n, 2 * n, o, n, begin, end, n);
  });
}

}  // namespace modelplex_swiglu
