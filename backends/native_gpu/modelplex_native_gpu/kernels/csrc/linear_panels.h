// linear.cpp's panel loop over a range of a packed fp32 weight's column panels, for packed_linear (its
// threads' shares, at::parallel_for's split) and dense_layer.cpp's one-region decode step (its threads'
// shares of the same panels): each output column is computed the same way whatever the split.
#pragma once

#include <algorithm>
#include <cstdint>

#include "linear_tile.h"

namespace {

constexpr int64_t kBlockBytes = 512 << 10;  // tokens' inputs held in L2 while a thread's panels go by

// ys [M, N] columns of panels [p0, p1) = xs [M, K] (contiguous) times ws (pack_linear_weight's layout)
// transposed, + b [N] where not null.
inline void linear_panels(const float* xs, int64_t M, int64_t K, const float* ws, int64_t N, const float* b, float* ys,
                          int64_t p0, int64_t p1) {
  const int64_t row_block = std::max<int64_t>(1, kBlockBytes / (K * kRows * 4)) * kRows;
  float tail[kRows][kPanel];  // the last panel's outputs when N is not a multiple of kPanel
  for (int64_t m0 = 0; m0 < M; m0 += row_block) {
    const int64_t m1 = std::min(M, m0 + row_block);
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t n0 = p * kPanel, cols = std::min(kPanel, N - n0);
      const float* panel = ws + p * K * kPanel;
      for (int64_t m = m0; m < m1; m += kRows) {
        const int64_t rows = std::min(kRows, m1 - m), j = (m - m0) / kRows;
        const float* ahead = p + 1 < p1 && j < kPrefetchTiles ? panel + K * kPanel + j * K * kLineFloats : nullptr;
        if (cols == kPanel) {
          tile_rows(rows, xs + m * K, K, panel, K, b == nullptr ? nullptr : b + n0, ys + m * N + n0, N, ahead);
          continue;
        }
        tile_rows(rows, xs + m * K, K, panel, K, nullptr, tail[0], kPanel, ahead);
        for (int64_t i = 0; i < rows; ++i) {
          for (int64_t c = 0; c < cols; ++c) ys[(m + i) * N + n0 + c] = tail[i][c] + (b == nullptr ? 0.f : b[n0 + c]);
        }
      }
    }
  }
}

}  // namespace
