// linear_bf16.cpp's register tiles and panel loop over a range of a packed bf16 weight's column panels, for
// packed_linear_bf16 (its threads' shares, at::parallel_for's split) and dense_layer.cpp's one-region decode step
// (its threads' shares of the same panels): each output column is computed the same way whatever the split.
// AVX512_BF16 only (the includer checks).
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace modelplex_linear_bf16 {
namespace {  // internal linkage in each includer, as these were in linear_bf16.cpp

constexpr int64_t kLanes = 16;              // fp32 outputs a register holds
constexpr int64_t kPanel = 2 * kLanes;      // output columns a panel holds: two registers wide
constexpr int64_t kRows = 12;               // 24 accumulators + 2 weight registers + broadcasts of 32
constexpr int64_t kPairBytes = kPanel * 4;  // one k pair of a panel: 128 bytes, two cache lines
// Tokens' inputs held in cache while a thread's panels go by. Not L2-sized as in linear.cpp: at the 1B shape
// (K 2048-8192, panels of 128-512 KB) a 512 KB block re-streamed the weight from memory for every 24-120 tokens
// (256 tokens: 37 ms a layer vs 33 with 4 MB, where oneDNN takes 33; SmolLM2's sizes unchanged).
constexpr int64_t kBlockBytes = 4 << 20;

inline __m512bh pair_of(const uint16_t* x) {  // x[0], x[1] broadcast to every lane
  int32_t v;
  std::memcpy(&v, x, 4);
  return (__m512bh)_mm512_set1_epi32(v);
}

inline void store(float* y, __m512 v) { _mm512_storeu_ps(y, v); }
inline void store(uint16_t* y, __m512 v) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(y), (__m256i)_mm512_cvtneps_pbh(v)); }

// y_i[0:kPanel] = x_i . panel (+ bias) for R tokens (rows of x `ldx` elements apart, of y `ldy`). The panel
// (K2 pairs x kPanel columns) is read once for all R. `ahead`, if set: the next panel, prefetched as this one
// goes by (one panel ahead hides the memory's latency when a single token streams the weight).
template <int64_t R, typename T>
void tile(const uint16_t* x, int64_t ldx, const uint16_t* panel, int64_t K2, const float* bias, T* y, int64_t ldy,
          const char* ahead) {
  __m512 lo[R], hi[R];
  for (int64_t i = 0; i < R; ++i) lo[i] = hi[i] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K2; ++k) {
    if (ahead != nullptr) {
      _mm_prefetch(ahead + k * kPairBytes, _MM_HINT_T0);
      _mm_prefetch(ahead + k * kPairBytes + 64, _MM_HINT_T0);
    }
    const __m512bh w0 = (__m512bh)_mm512_loadu_si512(panel + k * 2 * kPanel);
    const __m512bh w1 = (__m512bh)_mm512_loadu_si512(panel + k * 2 * kPanel + 2 * kLanes);
    for (int64_t i = 0; i < R; ++i) {
      const __m512bh a = pair_of(x + i * ldx + 2 * k);
      lo[i] = _mm512_dpbf16_ps(lo[i], a, w0);
      hi[i] = _mm512_dpbf16_ps(hi[i], a, w1);
    }
  }
  for (int64_t i = 0; i < R; ++i) {
    if (bias != nullptr) {
      lo[i] = _mm512_add_ps(lo[i], _mm512_loadu_ps(bias));
      hi[i] = _mm512_add_ps(hi[i], _mm512_loadu_ps(bias + kLanes));
    }
    store(y + i * ldy, lo[i]);
    store(y + i * ldy + kLanes, hi[i]);
  }
}

template <int64_t R = kRows, typename T>
void tile_rows(int64_t rows, const uint16_t* x, int64_t ldx, const uint16_t* panel, int64_t K2, const float* bias,
               T* y, int64_t ldy, const char* ahead) {
  if constexpr (R > 1) {
    if (rows < R) return tile_rows<R - 1>(rows, x, ldx, panel, K2, bias, y, ldy, ahead);
  }
  tile<R>(x, ldx, panel, K2, bias, y, ldy, ahead);
}

// ys [M, N] (T: bf16 bits or fp32) columns of panels [p0, p1) = xs [M, 2 K2] (rows ldx apart) times ws
// (pack_linear_weight_bf16's layout) transposed, + b [panels * kPanel] where not null.
template <typename T>
void linear_panels(const uint16_t* xs, int64_t M, int64_t ldx, const uint16_t* ws, int64_t K2, const float* b, T* ys,
                   int64_t N, int64_t p0, int64_t p1) {
  const int64_t row_block = std::max<int64_t>(1, kBlockBytes / (K2 * 4 * kRows)) * kRows;
  T tail[kRows][kPanel];  // the last panel's outputs when N is not a multiple of kPanel (bias added)
  for (int64_t m0 = 0; m0 < M; m0 += row_block) {
    const int64_t m1 = std::min(M, m0 + row_block);
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t n0 = p * kPanel, cols = std::min(kPanel, N - n0);
      const uint16_t* panel = ws + p * K2 * 2 * kPanel;
      const float* bias = b == nullptr ? nullptr : b + n0;
      for (int64_t m = m0; m < m1; m += kRows) {
        const int64_t rows = std::min(kRows, m1 - m);
        const char* ahead = p + 1 < p1 && m == m0 ? reinterpret_cast<const char*>(panel + K2 * 2 * kPanel) : nullptr;
        if (cols == kPanel) {
          tile_rows(rows, xs + m * ldx, ldx, panel, K2, bias, ys + m * N + n0, N, ahead);
          continue;
        }
        tile_rows(rows, xs + m * ldx, ldx, panel, K2, bias, tail[0], kPanel, ahead);
        for (int64_t i = 0; i < rows; ++i) std::memcpy(ys + (m + i) * N + n0, tail[i], cols * sizeof(T));
      }
    }
  }
}

}  // namespace
}  // namespace modelplex_linear_bf16
