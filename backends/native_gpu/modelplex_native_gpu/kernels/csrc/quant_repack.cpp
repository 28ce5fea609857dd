// Q4_0, Q4_1 and Q8_0 weights repacked at load for the matrix-vector product at decode ("Q4_0x16", "Q4_1x16",
// "Q8_0x16", quant_repack.h). In ggml's layout one row's 32-weight block costs a thread ~12 vector operations (nibbles
// to int16, minus 8, multiply with the activations, the fp16 scale converted and broadcast, int to float,
// fma): ~19 GB/s of blocks a thread, compute-bound. Here 16 rows sit side by side, so a 512-bit vector holds
// one pair of weights of each of the 16 rows: one vpdpwssd multiplies it with an activation pair broadcast
// from memory, one vcvtph2ps converts the 16 rows' scales of a block, and the codes need no "minus 8"
// (8 sum(q) is subtracted once a block from the integer dot product): ~3 operations a row's block.
//
// Layout of an [N, K] weight: the same bytes as the file's, in the same [N, K / 32 * 18 (Q4_1: 20, Q8_0: 34)]
// uint8 tensor. Rows 16 g .. 16 g + 15 (g < N / 16) form group g, its K / 32 blocks in k order, 288 (Q4_1: 320)
// bytes a block:
//   bytes 0..31    the 16 rows' fp16 scales, row r at 2 r; Q4_1: bytes 32..63 the 16 rows' fp16 mins;
//   then 4 chunks c of 64 bytes = 32 uint16 words: word 2 r + h holds in its nibble p (bits 4p..4p+3) the
//                  code (0..15, the file's nibble) of row r's weight 8 c + 2 p + h.
// The words of chunk c masked to nibble p are thus, as int16 pairs, weights (8c+2p, 8c+2p+1) of all 16 rows.
// Q8_0 (544 bytes a block): bytes 0..31 the 16 rows' fp16 scales, then 16 chunks p of 32 bytes: bytes 2 r, 2 r + 1
// of chunk p are the int8 codes of row r's weights 2 p, 2 p + 1, so one sign extension (vpmovsxbw) of a chunk is
// the int16 pair vector of weights (2p, 2p+1) of the 16 rows: ~2 operations a row's block and no nibbles.
// The last N % 16 rows stay in the file's layout after the groups. A group's bytes are its 16 rows' bytes,
// so the repacking is in place, group by group.
//
// A decode step reads each weight once and its weights are many times the L3 cache (32 MB here), so each pass
// evicted all of it. Bytes a step cannot keep there are prefetched non-temporal (prefetchnta), which on Zen 5
// leaves the L3 cache alone; a fixed share of each product (`keep`, decode_step.cpp: half the L3 cache over the
// step's bytes) is read as usual and comes from L3 the next step. Paired runs, 1B Q4_0 at one sequence: +4-7%
// tok/s (results/gguf_decode_speed.md); the microbenchmark: 19 MB read after 132 MB of other weights, 55 GB/s
// (normal stream) vs 90 (non-temporal stream).
//
// Every output, whatever the build or the batch, is the same operations: per block the exact integer dot
// product dot(codes, q) - 8 sum(q) (Q4_1, Q8_0: dot(codes, q)), then acc = fma(float(dot), scale_w * d, acc) as one
// fused operation; Q4_1 adds mins = fma(min_w, d sum(q), mins) once at the end.
#include "quant_repack.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <vector>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#include <immintrin.h>
#define QR_VNNI 1
#endif

namespace modelplex_quant {
namespace {

constexpr int64_t kQ4_0 = 2, kQ4_1 = 3, kQ8_0 = 8, kRows = 16;
constexpr int64_t kTokenBlock = 64;  // tokens whose int16 activations stay in L2 while a thread's groups go by
// Set by each whole decode step (decode_step.cpp): its weights do not all fit the L3 cache, so the other
// products at one pass (the LM head) stream theirs too, rather than evict the part the step keeps there.
std::atomic<bool> g_streaming{false};

// A file block: `head` bytes (fp16 scale, Q4_1's fp16 min) then `codes` bytes (16 of nibbles, Q8_0's 32 int8);
// a group's block: the 16 rows' heads field by field (16 scales, then Q4_1's 16 mins), then the chunks of codes.
template <int64_t T> struct Fmt;
template <> struct Fmt<kQ4_0> { static constexpr int64_t head = 2, codes = 16, offset = 8; };
template <> struct Fmt<kQ4_1> { static constexpr int64_t head = 4, codes = 16, offset = 0; };
template <> struct Fmt<kQ8_0> { static constexpr int64_t head = 2, codes = 32, offset = 0; };
template <int64_t T> constexpr int64_t kBytes = Fmt<T>::head + Fmt<T>::codes;  // a file block
template <int64_t T> constexpr int64_t kGroupBytes = kRows * kBytes<T>;     // a group's block
template <int64_t T> constexpr int64_t kCodes = kRows * Fmt<T>::head;       // where a group block's codes start

inline float fp16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return static_cast<float>(c10::Half(h, c10::Half::from_bits()));  // exact (as F16C's conversion)
}

// Code (Q4: 0..15, Q8_0: -128..127) of weight k (0..31) of row r in a group's block of codes.
template <int64_t T>
inline int group_code(const uint8_t* codes, int64_t r, int k) {
  if constexpr (T == kQ8_0) return static_cast<int8_t>(codes[32 * (k / 2) + 2 * r + k % 2]);
  const uint8_t* word = codes + 64 * (k / 8) + 2 * (2 * r + k % 2);
  return ((word[0] | (word[1] << 8)) >> (4 * ((k % 8) / 2))) & 15;
}

// Code of weight k of a file block's codes.
template <int64_t T>
inline int ggml_code(const uint8_t* qs, int k) {
  if constexpr (T == kQ8_0) return static_cast<int8_t>(qs[k]);
  return k < 16 ? qs[k] & 15 : qs[k - 16] >> 4;
}

template <int64_t T>
void repack_group(uint8_t* g, int64_t nb, uint8_t* scratch) {
  constexpr int64_t head = Fmt<T>::head;
  const int64_t row_bytes = nb * kBytes<T>;
  std::memcpy(scratch, g, kRows * row_bytes);
  for (int64_t b = 0; b < nb; ++b) {
    uint8_t* out = g + b * kGroupBytes<T>;
    for (int64_t r = 0; r < kRows; ++r) {
      const uint8_t* src = scratch + r * row_bytes + b * kBytes<T>;
      for (int64_t f = 0; f < head / 2; ++f) std::memcpy(out + 32 * f + 2 * r, src + 2 * f, 2);
      if constexpr (T == kQ8_0) {
        for (int k = 0; k < 32; ++k) out[kCodes<T> + 32 * (k / 2) + 2 * r + k % 2] = src[head + k];
      } else {
        for (int c = 0; c < 4; ++c) {
          for (int h = 0; h < 2; ++h) {
            int v = 0;
            for (int p = 0; p < 4; ++p) v |= ggml_code<T>(src + head, 8 * c + 2 * p + h) << (4 * p);
            uint8_t* word = out + kCodes<T> + 64 * c + 2 * (2 * r + h);
            word[0] = static_cast<uint8_t>(v & 0xFF);
            word[1] = static_cast<uint8_t>(v >> 8);
          }
        }
      }
    }
  }
}

// One output: a row (code(b, k), scale(b), Q4_1's min(b)) times one token's activations.
template <int64_t T, typename Code, typename Scale, typename Min>
float row_dot(int64_t nb, Code code, Scale scale, Min min, const int16_t* q, const float* d, const int32_t* qsum) {
  float acc = 0.f, mins = 0.f;
  for (int64_t b = 0; b < nb; ++b) {
    int32_t dot = -Fmt<T>::offset * qsum[b];
    for (int k = 0; k < 32; ++k) dot += code(b, k) * q[b * 32 + k];
    acc = std::fma(static_cast<float>(dot), scale(b) * d[b], acc);
    if constexpr (T == kQ4_1) mins = std::fma(min(b), d[b] * static_cast<float>(qsum[b]), mins);
  }
  return acc + mins;
}

template <int64_t T>
float group_row_dot(const uint8_t* g, int64_t nb, int64_t r, const int16_t* q, const float* d, const int32_t* qsum) {
  return row_dot<T>(nb, [&](int64_t b, int k) { return group_code<T>(g + b * kGroupBytes<T> + kCodes<T>, r, k); },
                    [&](int64_t b) { return fp16(g + b * kGroupBytes<T> + 2 * r); },
                    [&](int64_t b) { return fp16(g + b * kGroupBytes<T> + 32 + 2 * r); }, q, d, qsum);
}

template <int64_t T>
float ggml_row_dot(const uint8_t* row, int64_t nb, const int16_t* q, const float* d, const int32_t* qsum) {
  return row_dot<T>(nb, [&](int64_t b, int k) { return ggml_code<T>(row + b * kBytes<T> + Fmt<T>::head, k); },
                    [&](int64_t b) { return fp16(row + b * kBytes<T>); },
                    [&](int64_t b) { return fp16(row + b * kBytes<T> + 2); }, q, d, qsum);
}

// How far ahead the tiles prefetch: 4096 left the down projection's stream 8-13% short in this machine's
// high-bandwidth state; in the low one the distance hardly matters (benchmarks/results/quant_stream.md).
#ifndef QR_PREFETCH
#define QR_PREFETCH 6144
#endif
#if QR_VNNI
constexpr int64_t kTileTokens = 4;

// w[p] = the int16 pairs (weights 8c+2p, 8c+2p+1 of the 16 rows) of chunk c's 4 pairs in a group block's codes.
template <int64_t T>
inline void weight_pairs(const uint8_t* codes, int64_t c, __m512i w[4]) {
  if constexpr (T == kQ8_0) {
#pragma GCC unroll 4
    for (int64_t p = 0; p < 4; ++p)
      w[p] = _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + 32 * (4 * c + p))));
  } else {
    const __m512i low = _mm512_set1_epi16(0x000F);
    const __m512i v = _mm512_loadu_si512(codes + 64 * c);
    w[0] = _mm512_and_si512(v, low);
    w[1] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
    w[2] = _mm512_and_si512(_mm512_srli_epi16(v, 8), low);
    w[3] = _mm512_srli_epi16(v, 12);
  }
}

// y[j][0..15] = the group's 16 rows times token j, for MR tokens (q, d, qsum at the tile's first token).
template <int64_t T, int64_t MR>
void group_tile(const uint8_t* g, int64_t nb, const int16_t* q, int64_t K, const float* d, const int32_t* qsum,
                float* y, int64_t ldy, const uint8_t* keep_end) {
  constexpr int64_t A = MR == 1 ? 4 : MR == 2 ? 2 : 1;  // integer accumulators a token: independent chains
  __m512 facc[MR], fmin[MR];
#pragma GCC unroll 8
  for (int64_t j = 0; j < MR; ++j) facc[j] = fmin[j] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = g + b * kGroupBytes<T>;
    const uint8_t* pf = blk + QR_PREFETCH;
    if (pf < keep_end) {
#pragma GCC unroll 8
      for (int64_t l = 0; l < kGroupBytes<T>; l += 64) __builtin_prefetch(pf + l);
    } else {  // streamed: not left in the L3 cache, so the kept bytes stay there
#pragma GCC unroll 8
      for (int64_t l = 0; l < kGroupBytes<T>; l += 64) __builtin_prefetch(pf + l, 0, 0);
    }
    __m512i acc[MR][A];
#pragma GCC unroll 8
    for (int64_t j = 0; j < MR; ++j) {
      acc[j][0] = _mm512_set1_epi32(-Fmt<T>::offset * qsum[j * nb + b]);
#pragma GCC unroll 8
      for (int64_t a = 1; a < A; ++a) acc[j][a] = _mm512_setzero_si512();
    }
#pragma GCC unroll 4
    for (int64_t c = 0; c < 4; ++c) {
      __m512i w[4];
      weight_pairs<T>(blk + kCodes<T>, c, w);
#pragma GCC unroll 4
      for (int64_t p = 0; p < 4; ++p) {
#pragma GCC unroll 8
        for (int64_t j = 0; j < MR; ++j) {
          int32_t pair;  // activations 8c+2p, 8c+2p+1 of the block, broadcast to the 16 rows
          std::memcpy(&pair, q + j * K + b * 32 + 8 * c + 2 * p, 4);
          __m512i& s = acc[j][(4 * c + p) % A];
          s = _mm512_dpwssd_epi32(s, w[p], _mm512_set1_epi32(pair));
        }
      }
    }
    const __m512 scale = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk)));
#pragma GCC unroll 8
    for (int64_t j = 0; j < MR; ++j) {
      __m512i dot = acc[j][0];
#pragma GCC unroll 8
      for (int64_t a = 1; a < A; ++a) dot = _mm512_add_epi32(dot, acc[j][a]);
      const float dx = d[j * nb + b];
      facc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(scale, _mm512_set1_ps(dx)), facc[j]);
      if constexpr (T == kQ4_1) {
        const __m512 mins = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 32)));
        fmin[j] = _mm512_fmadd_ps(mins, _mm512_set1_ps(dx * static_cast<float>(qsum[j * nb + b])), fmin[j]);
      }
    }
  }
#pragma GCC unroll 8
  for (int64_t j = 0; j < MR; ++j) _mm512_storeu_ps(y + j * ldy, _mm512_add_ps(facc[j], fmin[j]));
}
#else  // portable: the same operations one output at a time
constexpr int64_t kTileTokens = 1;

template <int64_t T, int64_t MR>
void group_tile(const uint8_t* g, int64_t nb, const int16_t* q, int64_t K, const float* d, const int32_t* qsum,
                float* y, int64_t ldy, const uint8_t*) {
  for (int64_t j = 0; j < MR; ++j)
    for (int64_t r = 0; r < kRows; ++r)
      y[j * ldy + r] = group_row_dot<T>(g, nb, r, q + j * K, d + j * nb, qsum + j * nb);
}
#endif

template <int64_t T, int64_t MR = kTileTokens>
void group_tile_m(int64_t tokens, const uint8_t* g, int64_t nb, const int16_t* q, int64_t K, const float* d,
                  const int32_t* qsum, float* y, int64_t ldy, const uint8_t* keep_end) {
  if constexpr (MR > 1) {
    if (tokens < MR) return group_tile_m<T, MR - 1>(tokens, g, nb, q, K, d, qsum, y, ldy, keep_end);
  }
  group_tile<T, MR>(g, nb, q, K, d, qsum, y, ldy, keep_end);
}

// Groups [g0, g1) of y (and the last N % 16 rows, in the file's layout, when `tail`). The first `keep` (a
// fraction) of the groups' bytes are read as usual; the rest, where the groups are read once (M <= 64), with
// non-temporal prefetches.
template <int64_t T>
void linear_groups(const uint8_t* w, int64_t N, int64_t K, const int16_t* q, const float* d, const int32_t* qsum,
                   int64_t M, float* y, int64_t g0, int64_t g1, bool tail, double keep) {
  const int64_t nb = K / 32, row_bytes = nb * kBytes<T>;
  const uint8_t* begin = w + g0 * kRows * row_bytes;
  const int64_t bytes = (g1 - g0) * kRows * row_bytes;
  const uint8_t* keep_end = M > kTokenBlock || keep >= 1. ? begin + bytes + QR_PREFETCH
                                                           : begin + static_cast<int64_t>(keep * bytes);
  for (int64_t m0 = 0; m0 < M; m0 += kTokenBlock) {
    const int64_t m1 = std::min(M, m0 + kTokenBlock);
    for (int64_t g = g0; g < g1; ++g) {
      for (int64_t m = m0; m < m1; m += kTileTokens) {
        group_tile_m<T>(std::min(kTileTokens, m1 - m), w + g * kRows * row_bytes, nb, q + m * K, K, d + m * nb,
                        qsum + m * nb, y + m * N + g * kRows, N, keep_end);
      }
    }
  }
  if (!tail) return;
  for (int64_t r = N / kRows * kRows; r < N; ++r)
    for (int64_t m = 0; m < M; ++m)
      y[m * N + r] = ggml_row_dot<T>(w + r * row_bytes, nb, q + m * K, d + m * nb, qsum + m * nb);
}

template <int64_t T>
void linear(const uint8_t* w, int64_t N, int64_t K, const int16_t* q, const float* d, const int32_t* qsum, int64_t M,
            float* y) {
  const double keep = g_streaming.load(std::memory_order_relaxed) ? 0. : 1.;
  at::parallel_for(0, N / kRows, 1, [&](int64_t g0, int64_t g1) {
    linear_groups<T>(w, N, K, q, d, qsum, M, y, g0, g1, false, keep);
  });
  linear_groups<T>(w, N, K, q, d, qsum, M, y, 0, 0, true, 1.);
}

// Row `row` in the operations of gguf.quants' dequantize: Q4_0 d (q - 8), Q4_1 d q + m, Q8_0 d q.
template <int64_t T>
void dequantize_row(const uint8_t* w, int64_t N, int64_t K, int64_t row, float* out) {
  const int64_t nb = K / 32, row_bytes = nb * kBytes<T>;
  const bool tail = row >= N / kRows * kRows;
  const uint8_t* g = w + (tail ? row * row_bytes : row / kRows * kRows * row_bytes);
  const int64_t r = row % kRows;
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = g + b * (tail ? kBytes<T> : kGroupBytes<T>);
    const float dw = fp16(tail ? blk : blk + 2 * r);
    for (int k = 0; k < 32; ++k) {
      const int c = tail ? ggml_code<T>(blk + Fmt<T>::head, k) : group_code<T>(blk + kCodes<T>, r, k);
      if constexpr (T == kQ4_0) out[b * 32 + k] = dw * static_cast<float>(c - 8);
      else if constexpr (T == kQ8_0) out[b * 32 + k] = dw * static_cast<float>(c);
      else out[b * 32 + k] = dw * static_cast<float>(c) + fp16(tail ? blk + 2 : blk + 32 + 2 * r);
    }
  }
}

// data [N, row bytes] in `qtype`'s file blocks, rewritten in place in `to_type`'s layout (Q4_0 -> Q4_0x16,
// Q4_1 -> Q4_1x16, Q8_0 -> Q8_0x16).
void quant_repack_(at::Tensor data, int64_t qtype, int64_t to_type) {
  const bool q4_0 = qtype == kQ4_0 && to_type == kQ4_0x16, q4_1 = qtype == kQ4_1 && to_type == kQ4_1x16;
  const bool q8_0 = qtype == kQ8_0 && to_type == kQ8_0x16;
  TORCH_CHECK(q4_0 || q4_1 || q8_0, "quant_repack_: no layout ", to_type, " for GGML type ", qtype);
  const int64_t bytes = q4_0 ? kBytes<kQ4_0> : q4_1 ? kBytes<kQ4_1> : kBytes<kQ8_0>;
  TORCH_CHECK(data.scalar_type() == at::kByte && data.dim() == 2 && data.is_contiguous() && data.size(1) % bytes == 0,
              "quant_repack_: expected contiguous uint8 [rows, whole blocks]");
  const int64_t nb = data.size(1) / bytes, groups = data.size(0) / kRows;
  uint8_t* w = data.data_ptr<uint8_t>();
  at::parallel_for(0, groups, 16, [&](int64_t g0, int64_t g1) {
    std::vector<uint8_t> scratch(kRows * nb * bytes);
    for (int64_t g = g0; g < g1; ++g) {
      uint8_t* group = w + g * kRows * nb * bytes;
      if (q4_0) repack_group<kQ4_0>(group, nb, scratch.data());
      else if (q4_1) repack_group<kQ4_1>(group, nb, scratch.data());
      else repack_group<kQ8_0>(group, nb, scratch.data());
    }
  });
}

// The layout this build's kernels multiply fastest for a GGML type (itself where none is better).
int64_t quant_repacked_type(int64_t qtype) {
#if QR_VNNI
  if (qtype == kQ4_0) return kQ4_0x16;
  if (qtype == kQ4_1) return kQ4_1x16;
  if (qtype == kQ8_0) return kQ8_0x16;
#endif
  return qtype;
}

}  // namespace

void group16_linear(int64_t type, const uint8_t* w, int64_t N, int64_t K, const int16_t* q, const float* d,
                    const int32_t* qsum, int64_t M, float* y) {
  if (type == kQ4_0x16) linear<kQ4_0>(w, N, K, q, d, qsum, M, y);
  else if (type == kQ4_1x16) linear<kQ4_1>(w, N, K, q, d, qsum, M, y);
  else linear<kQ8_0>(w, N, K, q, d, qsum, M, y);
}

void group16_linear_part(int64_t type, const uint8_t* w, int64_t N, int64_t K, const int16_t* q, const float* d,
                         const int32_t* qsum, int64_t M, float* y, int64_t part, int64_t parts, double keep) {
  const int64_t groups = N / kRows, chunk = (groups + parts - 1) / parts;
  const int64_t g0 = std::min(groups, part * chunk), g1 = std::min(groups, g0 + chunk);
  const bool tail = part == parts - 1;
  if (type == kQ4_0x16) linear_groups<kQ4_0>(w, N, K, q, d, qsum, M, y, g0, g1, tail, keep);
  else if (type == kQ4_1x16) linear_groups<kQ4_1>(w, N, K, q, d, qsum, M, y, g0, g1, tail, keep);
  else linear_groups<kQ8_0>(w, N, K, q, d, qsum, M, y, g0, g1, tail, keep);
}

void group16_linear_groups(int64_t type, const uint8_t* w, int64_t N, int64_t K, const int16_t* q, const float* d,
                           const int32_t* qsum, int64_t M, float* y, int64_t g0, int64_t g1, double keep) {
  if (type == kQ4_0x16) linear_groups<kQ4_0>(w, N, K, q, d, qsum, M, y, g0, g1, false, keep);
  else if (type == kQ4_1x16) linear_groups<kQ4_1>(w, N, K, q, d, qsum, M, y, g0, g1, false, keep);
  else linear_groups<kQ8_0>(w, N, K, q, d, qsum, M, y, g0, g1, false, keep);
}

void set_group16_streaming(bool streaming) { g_streaming.store(streaming, std::memory_order_relaxed); }

void group16_dequantize_row(int64_t type, const uint8_t* w, int64_t N, int64_t K, int64_t row, float* out) {
  if (type == kQ4_0x16) dequantize_row<kQ4_0>(w, N, K, row, out);
  else if (type == kQ4_1x16) dequantize_row<kQ4_1>(w, N, K, row, out);
  else dequantize_row<kQ8_0>(w, N, K, row, out);
}

}  // namespace modelplex_quant

TORCH_LIBRARY_FRAGMENT(modelplex_cpu, m) {
  m.def("quant_repack_(Tensor(a!) data, int qtype, int to_type) -> ()");
  m.def("quant_repacked_type(int qtype) -> int", &modelplex_quant::quant_repacked_type);  // no tensor: one kernel
}

TORCH_LIBRARY_IMPL(modelplex_cpu, CPU, m) {
  m.impl("quant_repack_", &modelplex_quant::quant_repack_);
}
