// The fp32 register-tiled micro-kernel of linear.cpp, shared with quant_gemm.cpp: R rows of a row-major
// operand (`x`, rows ldx apart) times a panel [K][kPanel] (kPanel columns side by side for each k). Each
// output is one FMA chain over k in order from zero, then + bias.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

namespace {

#if defined(__AVX512F__)
using vec = __m512;
constexpr int64_t kLanes = 16, kRows = 8;  // 16 accumulators + 2 weight + 1 broadcast of 32 registers
inline vec vzero() { return _mm512_setzero_ps(); }
inline vec vload(const float* p) { return _mm512_loadu_ps(p); }
inline vec vset1(float a) { return _mm512_set1_ps(a); }
inline vec vfma(vec a, vec b, vec c) { return _mm512_fmadd_ps(a, b, c); }
inline vec vadd(vec a, vec b) { return _mm512_add_ps(a, b); }
inline void vstore(float* p, vec v) { _mm512_storeu_ps(p, v); }
#elif defined(__AVX2__) && defined(__FMA__)
using vec = __m256;
constexpr int64_t kLanes = 8, kRows = 6;  // 12 accumulators + 2 weight + 1 broadcast of 16 registers
inline vec vzero() { return _mm256_setzero_ps(); }
inline vec vload(const float* p) { return _mm256_loadu_ps(p); }
inline vec vset1(float a) { return _mm256_set1_ps(a); }
inline vec vfma(vec a, vec b, vec c) { return _mm256_fmadd_ps(a, b, c); }
inline vec vadd(vec a, vec b) { return _mm256_add_ps(a, b); }
inline void vstore(float* p, vec v) { _mm256_storeu_ps(p, v); }
#else  // portable: the compiler vectorizes what it can
struct vec { float v[4]; };
constexpr int64_t kLanes = 4, kRows = 4;
inline vec vzero() { return vec{}; }
inline vec vload(const float* p) { vec r; for (int i = 0; i < 4; ++i) r.v[i] = p[i]; return r; }
inline vec vset1(float a) { return vec{{a, a, a, a}}; }
inline vec vfma(vec a, vec b, vec c) { for (int i = 0; i < 4; ++i) c.v[i] = std::fma(a.v[i], b.v[i], c.v[i]); return c; }
inline vec vadd(vec a, vec b) { for (int i = 0; i < 4; ++i) a.v[i] += b.v[i]; return a; }
inline void vstore(float* p, vec v) { for (int i = 0; i < 4; ++i) p[i] = v.v[i]; }
#endif

constexpr int64_t kPanel = 2 * kLanes;  // output columns a panel holds: two registers wide
// A panel is K x kPanel floats, K x kPanel / kLineFloats cache lines: the first tiles on a panel each fetch
// K lines of the next panel while they compute (the hardware prefetcher alone left ~20% of the FMA rate
// waiting on memory at 64 tokens).
constexpr int64_t kLineFloats = 16;
constexpr int64_t kPrefetchTiles = kPanel / kLineFloats;

// y_i[0:kPanel] = x_i . panel (+ bias) for R tokens (rows of x `ldx` apart, of y `ldy`). The panel
// (K x kPanel) is read once for all R; each x value is broadcast against two registers of weights.
// `ahead`, if set: K cache lines of the next panel to prefetch, one per k. kNarrow: only the panel's first
// kLanes columns (y_i[0:kLanes]), one register of weights (quant_gemm.cpp's last, partial token panel).
template <int64_t R, bool kNarrow = false>
void tile(const float* x, int64_t ldx, const float* panel, int64_t K, const float* bias, float* y, int64_t ldy,
          const float* ahead) {
  vec lo[R], hi[R];
  for (int64_t i = 0; i < R; ++i) lo[i] = hi[i] = vzero();
  for (int64_t k = 0; k < K; ++k) {
    if (ahead != nullptr) __builtin_prefetch(ahead + k * kLineFloats);
    const vec w0 = vload(panel + k * kPanel), w1 = kNarrow ? w0 : vload(panel + k * kPanel + kLanes);
    for (int64_t i = 0; i < R; ++i) {
      const vec a = vset1(x[i * ldx + k]);
      lo[i] = vfma(a, w0, lo[i]);
      if constexpr (!kNarrow) hi[i] = vfma(a, w1, hi[i]);
    }
  }
  for (int64_t i = 0; i < R; ++i) {
    if (bias != nullptr) {
      lo[i] = vadd(lo[i], vload(bias));
      if constexpr (!kNarrow) hi[i] = vadd(hi[i], vload(bias + kLanes));
    }
    vstore(y + i * ldy, lo[i]);
    if constexpr (!kNarrow) vstore(y + i * ldy + kLanes, hi[i]);
  }
}

template <int64_t R = kRows, bool kNarrow = false>
void tile_rows(int64_t rows, const float* x, int64_t ldx, const float* panel, int64_t K, const float* bias, float* y,
               int64_t ldy, const float* ahead) {
  if constexpr (R > 1) {
    if (rows < R) return tile_rows<R - 1, kNarrow>(rows, x, ldx, panel, K, bias, y, ldy, ahead);
  }
  tile<R, kNarrow>(x, ldx, panel, K, bias, y, ldy, ahead);
}

}  // namespace
