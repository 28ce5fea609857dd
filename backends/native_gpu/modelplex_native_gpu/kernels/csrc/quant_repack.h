// Q4_0, Q4_1 and Q8_0 weights repacked at load into groups of 16 rows (quant_repack.cpp), called from quant_linear.cpp.
#pragma once
#include <cstdint>

namespace modelplex_quant {

// Internal type numbers of the repacked layouts (ggml's numbers stay below 100).
constexpr int64_t kQ4_0x16 = 1002, kQ4_1x16 = 1003, kQ8_0x16 = 1008;

inline bool is_group16(int64_t type) { return type == kQ4_0x16 || type == kQ4_1x16 || type == kQ8_0x16; }

// y [M][N] = the int16 activations (q [M][K], d and qsum [M][K / 32]: x ~ d q a block of 32, qsum = sum(q))
// times the [N, K] weight w in layout `type` (kQ4_0x16, kQ4_1x16 or kQ8_0x16).
void group16_linear(int64_t type, const uint8_t* w, int64_t N, int64_t K, const int16_t* q, const float* d,
                    const int32_t* qsum, int64_t M, float* y);

// The same product, only part `part` of `parts` (a team's thread): its share of the 16-row groups, split as
// at::parallel_for splits them, and the last part also the N % 16 rows after them. The first `keep` (0..1) of
// the part's bytes are read as usual (cached: a step reads them again from the L3 cache); the rest, at up to
// 64 tokens, with non-temporal prefetches, which do not evict them.
void group16_linear_part(int64_t type, const uint8_t* w, int64_t N, int64_t K, const int16_t* q, const float* d,
                         const int32_t* qsum, int64_t M, float* y, int64_t part, int64_t parts, double keep);

// The same product, groups [g0, g1) of the weight's N / 16 only (none of the N % 16 rows after them); the
// first `keep` of their bytes read as usual, the rest streamed, as group16_linear_part's.
void group16_linear_groups(int64_t type, const uint8_t* w, int64_t N, int64_t K, const int16_t* q, const float* d,
                           const int32_t* qsum, int64_t M, float* y, int64_t g0, int64_t g1, double keep);

// Whether group16_linear streams its weights (non-temporal prefetches, up to 64 tokens): set by the whole-step
// decode when the step's weights do not fit the L3 cache, so the LM head after it keeps the step's kept bytes.
void set_group16_streaming(bool streaming);

// x [M][K] fp32 -> the int16 activations quant_linear multiplies (q [M][K], d and qsum [M][K / 32]), the same
// bits as its own; one thread.
void quantize_activations16(const float* x, int64_t M, int64_t K, int16_t* q, float* d, int32_t* qsum);

// Row `row` of the [N, K] weight w in layout `type` as fp32, bit for bit gguf's dequantization of the file's row.
void group16_dequantize_row(int64_t type, const uint8_t* w, int64_t N, int64_t K, int64_t row, float* out);

}  // namespace modelplex_quant
