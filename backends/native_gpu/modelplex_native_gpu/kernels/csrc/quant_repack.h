// Q4_0 weights repacked at load into groups of 16 rows (quant_repack.cpp), called from quant_linear.cpp's ops.
#pragma once
#include <cstdint>

namespace modelplex_quant {

// Internal type number of the repacked Q4_0 layout (ggml's numbers stay below 100).
constexpr int64_t kQ4_0x16 = 1002;

// y [M][N] = the int16 activations (q [M][K], d and qsum [M][K / 32]: x ~ d q a block of 32, qsum = sum(q))
// times the [N, K] Q4_0x16 weight w.
void q4x16_linear(const uint8_t* w, int64_t N, int64_t K, const int16_t* q, const float* d, const int32_t* qsum,
                  int64_t M, float* y);

// Row `row` of the [N, K] Q4_0x16 weight w as fp32, bit for bit gguf's dequantization of the file's row.
void q4x16_dequantize_row(const uint8_t* w, int64_t N, int64_t K, int64_t row, float* out);

}  // namespace modelplex_quant
