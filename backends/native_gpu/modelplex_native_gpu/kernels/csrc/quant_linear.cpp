// Linear layers on GGUF-quantized weights, kept in the file's block layout ([out_features][row bytes], ggml's
// blocks in k order), so loading is a copy of the file's bytes and no fp32 weight is ever held.
// - Q8_0, Q4_0, Q4_1, Q5_0: integer dot products, as llama.cpp's CPU backend does, but with each token's
//   activations as int16 a block of 32: q = round(x / d), d = amax / 32767. llama.cpp's int8 activations
//   (d = amax / 127) moved SmolLM2-135M's greedy answers (teacher-forced argmax agreement with transformers on
//   the same Q8_0 weights 97.9%, a chat answer changed at its first token). The weight codes (offset
//   subtracted) are sign-extended to int16 in registers and multiplied pairwise with vpdpwssd (AVX-512 VNNI)
//   or vpmaddwd: one multiply a block, where two int8 planes (the previous scheme, same precision) took two.
//   A block's product is scale_w * d * dot(w, q) (plus Q4_1's min times d sum(q)), accumulated in fp32.
//   Register tiles of kTileRows weight rows x kTileTokens tokens read each weight block once for all the
//   tile's tokens (matrix-vector at one token, GEMM at many). AVX-512 (512-bit vectors, a block a vector)
//   where the build has it, AVX2 otherwise, and a portable scalar path.
// - Q4_0 and Q4_1 repacked at load into 16-row groups (quant_repack.cpp, internal type numbers): their kernel.
// - Q4_K, Q5_K, Q6_K: a tile of rows dequantized to fp32 (L2-resident, never the whole weight), then fp32
//   dot products with the unquantized activations.
// Every output is computed by the same sequence of operations whatever the batch, so a token's outputs do
// not depend on the tokens batched with it, up to the batch size where a call goes to quant_gemm.cpp instead
// (quant_gemm_min_tokens: every size for K-quants, whose dequant_linear below is then only the A/B path).
// Dequantization equals gguf.quants.dequantize bit for bit (same operations in the same order; built with
// -ffp-contract=off).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include "quant_repack.h"
#include "swiglu.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <vector>

#include "quant_gemm.h"

#if defined(__F16C__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif
#if defined(__AVX2__) && defined(__FMA__)
#define QL_AVX2 1
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define QL_VNNI 1
#endif
#endif

namespace {

// ggml's type numbers (gguf.GGMLQuantizationType).
enum QType : int64_t { kQ4_0 = 2, kQ4_1 = 3, kQ5_0 = 6, kQ8_0 = 8, kQ4_K = 12, kQ5_K = 13, kQ6_K = 14 };
constexpr int64_t kQK = 256;  // K-quant super-block

struct Format {
  int64_t block;  // weights a block
  int64_t bytes;  // bytes a block
};

Format format_of(int64_t t) {
  switch (t) {
    case kQ4_0: return {32, 18};
    case modelplex_quant::kQ4_0x16: return {32, 18};
    case modelplex_quant::kQ4_1x16: return {32, 20};
    case modelplex_quant::kQ8_0x16: return {32, 34};
    case kQ4_1: return {32, 20};
    case kQ5_0: return {32, 22};
    case kQ8_0: return {32, 34};
    case kQ4_K: return {kQK, 144};
    case kQ5_K: return {kQK, 176};
    case kQ6_K: return {kQK, 210};
    default: TORCH_CHECK(false, "quantized linear: unsupported GGML type ", t);
  }
}

inline float fp16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
#if defined(__F16C__)
  return _cvtsh_ss(h);  // one instruction; c10::Half's portable conversion is ~15 (exact either way)
#else
  return static_cast<float>(c10::Half(h, c10::Half::from_bits()));
#endif
}

// K-quants' 6-bit scale and min of sub-block j (gguf's Q4_K.get_scale_min).
inline void scale_min_k4(int j, const uint8_t* s, int* sc, int* m) {
  if (j < 4) {
    *sc = s[j] & 63;
    *m = s[j + 4] & 63;
  } else {
    *sc = (s[j + 4] & 0x0F) | ((s[j - 4] >> 2) & 0x30);
    *m = (s[j + 4] >> 4) | ((s[j] >> 2) & 0x30);
  }
}

// One row of K weights to fp32, in the operations and order of gguf.quants' dequantize_blocks.
void dequantize_row(int64_t t, const uint8_t* src, int64_t K, float* out) {
  const Format f = format_of(t);
  for (int64_t b = 0; b < K / f.block; ++b, src += f.bytes, out += f.block) {
    switch (t) {
      case kQ8_0: {
        const float d = fp16(src);
        for (int i = 0; i < 32; ++i) out[i] = d * static_cast<float>(static_cast<int8_t>(src[2 + i]));
        break;
      }
      case kQ4_0: {
        const float d = fp16(src);
        for (int i = 0; i < 16; ++i) {
          out[i] = d * static_cast<float>((src[2 + i] & 0x0F) - 8);
          out[i + 16] = d * static_cast<float>((src[2 + i] >> 4) - 8);
        }
        break;
      }
      case kQ4_1: {
        const float d = fp16(src), m = fp16(src + 2);
        for (int i = 0; i < 16; ++i) {
          out[i] = d * static_cast<float>(src[4 + i] & 0x0F) + m;
          out[i + 16] = d * static_cast<float>(src[4 + i] >> 4) + m;
        }
        break;
      }
      case kQ5_0: {
        const float d = fp16(src);
        uint32_t qh;
        std::memcpy(&qh, src + 2, 4);
        for (int i = 0; i < 16; ++i) {
          const int lo = (src[6 + i] & 0x0F) | (((qh >> i) & 1) << 4);
          const int hi = (src[6 + i] >> 4) | (((qh >> (i + 16)) & 1) << 4);
          out[i] = d * static_cast<float>(lo - 16);
          out[i + 16] = d * static_cast<float>(hi - 16);
        }
        break;
      }
      case kQ4_K:
      case kQ5_K: {
        const float d = fp16(src), dmin = fp16(src + 2);
        const uint8_t* scales = src + 4;
        const uint8_t* qh = src + 16;  // Q5_K only
        const uint8_t* qs = src + (t == kQ4_K ? 16 : 48);
        for (int j = 0; j < 8; ++j) {  // sub-block j: 32 weights, nibble j % 2 of bytes qs[32 (j / 2) ...]
          int sc, m;
          scale_min_k4(j, scales, &sc, &m);
          const float dl = d * static_cast<float>(sc), ml = dmin * static_cast<float>(m);
          for (int l = 0; l < 32; ++l) {
            int q = (qs[(j / 2) * 32 + l] >> (4 * (j % 2))) & 0x0F;
            if (t == kQ5_K) q |= ((qh[l] >> j) & 1) << 4;
            out[j * 32 + l] = dl * static_cast<float>(q) - ml;
          }
        }
        break;
      }
      case kQ6_K: {
        const uint8_t* ql = src;
        const uint8_t* qh = src + 128;
        const int8_t* scales = reinterpret_cast<const int8_t*>(src + 192);
        const float d = fp16(src + 208);
        for (int e = 0; e < kQK; ++e) {  // half h, quarter s, lane l
          const int h = e / 128, s = (e % 128) / 32, l = e % 32;
          const int lo = (ql[h * 64 + (s % 2) * 32 + l] >> (4 * (s / 2))) & 0x0F;
          const int hi = (qh[h * 32 + l] >> (2 * s)) & 3;
          const float dl = d * static_cast<float>(scales[e / 16]);
          out[e] = dl * static_cast<float>((lo | (hi << 4)) - 32);
        }
        break;
      }
      default: TORCH_CHECK(false, "unsupported type");
    }
  }
}

// ---- activations as int16, blocks of 32 ---------------------------------------------------------------------
struct QuantizedActivations {
  int64_t K = 0, nb = 0;
  std::vector<int16_t> q;  // [M][K]: x ~ d q
  std::vector<float> d;    // [M][nb] scale, max|x| / 32767
  std::vector<float> sx;   // [M][nb] d sum(q): the block's sum of x~ (Q4_1's min term)
  std::vector<int32_t> qsum;  // [M][nb] sum(q) (the 16-row groups' offset and min terms)
};

constexpr float kQMax = 32767.f;

// One block of 32: q = round(x / d), d = max|x| / 32767 (|q| <= 32767 up to fp32 rounding: clamped).
inline void quantize_block(const float* v, int16_t* q, float* d_out, float* sx_out, int32_t* sum_out) {
#if defined(__AVX512F__) && defined(__AVX512BW__)
  const __m512 lo = _mm512_loadu_ps(v), hi = _mm512_loadu_ps(v + 16);
  const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(lo), _mm512_abs_ps(hi)));
  const float d = amax / kQMax, id = d != 0.f ? 1.f / d : 0.f;
  const __m512 vid = _mm512_set1_ps(id), lim = _mm512_set1_ps(kQMax);
  // cvtps rounds to nearest even, as std::nearbyint does in the default rounding mode
  const __m512i a = _mm512_cvtps_epi32(_mm512_max_ps(_mm512_min_ps(_mm512_mul_ps(lo, vid), lim), -lim));
  const __m512i b = _mm512_cvtps_epi32(_mm512_max_ps(_mm512_min_ps(_mm512_mul_ps(hi, vid), lim), -lim));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q), _mm512_cvtepi32_epi16(a));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + 16), _mm512_cvtepi32_epi16(b));
  const int32_t sum = _mm512_reduce_add_epi32(_mm512_add_epi32(a, b));
#else
  float amax = 0.f;
  for (int k = 0; k < 32; ++k) amax = std::max(amax, std::fabs(v[k]));
  const float d = amax / kQMax, id = d != 0.f ? 1.f / d : 0.f;
  int32_t sum = 0;
  for (int k = 0; k < 32; ++k) {
    q[k] = static_cast<int16_t>(std::nearbyint(std::clamp(v[k] * id, -kQMax, kQMax)));
    sum += q[k];
  }
#endif
  *d_out = d;
  *sx_out = d * static_cast<float>(sum);
  *sum_out = sum;
}

void quantize_activations(const float* x, int64_t M, int64_t K, QuantizedActivations& a) {
  a.K = K;
  a.nb = K / 32;
  a.q.resize(M * K);
  a.d.resize(M * a.nb);
  a.sx.resize(M * a.nb);
  a.qsum.resize(M * a.nb);
  const int64_t n = M * a.nb;
  auto run = [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t off = (i / a.nb) * K + (i % a.nb) * 32;
      quantize_block(x + off, a.q.data() + off, a.d.data() + i, a.sx.data() + i, a.qsum.data() + i);
    }
  };
  if (n <= 1024) run(0, n);  // a decode step's few hundred blocks: cheaper than waking a thread
  else at::parallel_for(0, n, 256, run);
}

// ---- one weight block, per format ---------------------------------------------------------------------------
// offset: the value subtracted from the unsigned codes (Q4_0 8, Q5_0 16); Q8_0 codes are signed; Q4_1 adds m.
template <int64_t T> struct Blk;
template <> struct Blk<kQ8_0> { static constexpr int64_t bytes = 34, offset = 0; };
template <> struct Blk<kQ4_0> { static constexpr int64_t bytes = 18, offset = 8; };
template <> struct Blk<kQ4_1> { static constexpr int64_t bytes = 20, offset = 0; };
template <> struct Blk<kQ5_0> { static constexpr int64_t bytes = 22, offset = 16; };

#if QL_AVX2
inline __m256i nibbles(const uint8_t* p) {  // 16 bytes -> 32 codes: low nibbles first (weights 0..15), then high
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m256i both = _mm256_set_m128i(_mm_srli_epi16(raw, 4), raw);
  return _mm256_and_si256(both, _mm256_set1_epi8(0x0F));
}

inline __m256i bits_to_bytes(const uint8_t* p) {  // 32 bits -> 0xFF where set (llama.cpp's bytes_from_bits_32)
  uint32_t x;
  std::memcpy(&x, p, 4);
  const __m256i shuf = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
  __m256i bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(x)), shuf);
  bytes = _mm256_or_si256(bytes, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
  return _mm256_cmpeq_epi8(bytes, _mm256_set1_epi64x(-1));
}

// The block's 32 weights as signed int8 codes (the format's offset subtracted; Q4_1's codes are 0..15).
template <int64_t T>
inline __m256i codes(const uint8_t* b) {
  if constexpr (T == kQ8_0) return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 2));
  if constexpr (T == kQ4_0) return _mm256_sub_epi8(nibbles(b + 2), _mm256_set1_epi8(8));
  if constexpr (T == kQ4_1) return nibbles(b + 4);
  if constexpr (T == kQ5_0) {
    const __m256i c = _mm256_or_si256(nibbles(b + 6), _mm256_and_si256(bits_to_bytes(b + 2), _mm256_set1_epi8(0x10)));
    return _mm256_sub_epi8(c, _mm256_set1_epi8(16));
  }
}

#if defined(__AVX512F__) && defined(__AVX512BW__)
// The block's 32 weights as int16 (offset subtracted). 4-bit codes: the 16 bytes zero-extended to words
// twice, the low nibbles taken from the first copy and the high ones from the second (3 operations).
using WVec = __m512i;
template <int64_t T>
inline WVec wcodes(const uint8_t* b) {
  if constexpr (T == kQ4_0 || T == kQ4_1) {
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + (T == kQ4_0 ? 2 : 4)));
    const __m512i words = _mm512_cvtepu8_epi16(_mm256_broadcastsi128_si256(raw));
    const __m512i shifts = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(4), 1);  // 0 x16, 4 x16
    const __m512i nib = _mm512_and_si512(_mm512_srlv_epi16(words, shifts), _mm512_set1_epi16(0x0F));
    return T == kQ4_0 ? _mm512_sub_epi16(nib, _mm512_set1_epi16(8)) : nib;
  } else {
    return _mm512_cvtepi8_epi16(codes<T>(b));
  }
}
// 32 int16 products a block summed pairwise into 16 int32 lanes.
using IVec = __m512i;
using FVec = __m512;
inline IVec block_dot(WVec w16, const int16_t* q) {
  const __m512i a16 = _mm512_loadu_si512(q);
  return _mm512_madd_epi16(w16, a16);  // vpdpwssd would need a zeroed accumulator: one more operation
}
inline FVec fzero() { return _mm512_setzero_ps(); }
inline FVec fmadd_block(IVec p, float scale, FVec acc) {
  return _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_set1_ps(scale), acc);
}
inline float fsum(FVec v) { return _mm512_reduce_add_ps(v); }
constexpr int64_t kTileTokens = 4;  // 16 accumulators of 32 vector registers
#else
using WVec = __m256i;
template <int64_t T>
inline WVec wcodes(const uint8_t* b) { return codes<T>(b); }
using IVec = __m256i;
using FVec = __m256;
inline IVec block_dot(WVec w8, const int16_t* q) {
  const __m256i lo = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(w8));
  const __m256i hi = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(w8, 1));
  const __m256i a0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q));
  const __m256i a1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 16));
  return _mm256_add_epi32(_mm256_madd_epi16(lo, a0), _mm256_madd_epi16(hi, a1));
}
inline FVec fzero() { return _mm256_setzero_ps(); }
inline FVec fmadd_block(IVec p, float scale, FVec acc) {
  return _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(scale), acc);
}
inline float fsum(FVec v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 s2 = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
}
constexpr int64_t kTileTokens = 2;  // 8 accumulators of 16
#endif
#ifndef QL_TILE_ROWS
#define QL_TILE_ROWS 4
#endif
#ifndef QL_PREFETCH
#define QL_PREFETCH 8192
#endif
constexpr int64_t kTileRows = QL_TILE_ROWS;
constexpr int64_t kPrefetchBytes = QL_PREFETCH;

// y[j][i] = row i . token j for NR weight rows (row_bytes apart) x MR tokens.
template <int64_t T, int64_t MR, int64_t NR>
void int_tile(const uint8_t* w, int64_t row_bytes, const QuantizedActivations& a, int64_t m0, float* y, int64_t ldy) {
  using B = Blk<T>;
  // Unrolled loops over rows and tokens: the accumulators then live in registers (without the pragmas gcc
  // kept some on the stack, a store and reload on each one's dependency chain every block).
  FVec acc[MR][NR];
  float mins[MR][NR] = {};
#pragma GCC unroll 8
  for (int64_t j = 0; j < MR; ++j)
#pragma GCC unroll 8
    for (int64_t i = 0; i < NR; ++i) acc[j][i] = fzero();
  const int64_t nb = a.nb, K = a.K;
  const int16_t* q = a.q.data() + m0 * K;
  const float* d = a.d.data() + m0 * nb;
  const float* sx = a.sx.data() + m0 * nb;
  // The tile's NR rows are one contiguous region, and a thread's tiles follow each other: its weights are one
  // stream, consumed NR blocks an iteration. Rows of a few hundred bytes (SmolLM2's) are too short for the
  // hardware prefetchers to follow each row, so the stream is prefetched kPrefetchBytes ahead of where it is
  // consumed on average (into the next tiles near a tile's end).
  const uint8_t* pf = w + kPrefetchBytes;
  constexpr int64_t kStep = NR * B::bytes;
  for (int64_t b = 0; b < nb; ++b, pf += kStep) {
#pragma GCC unroll 8
    for (int64_t l = 0; l < kStep; l += 64) __builtin_prefetch(pf + l);
#pragma GCC unroll 8
    for (int64_t i = 0; i < NR; ++i) {
      const uint8_t* blk = w + i * row_bytes + b * B::bytes;
      const WVec wq = wcodes<T>(blk);
      const float dw = fp16(blk);
#pragma GCC unroll 8
      for (int64_t j = 0; j < MR; ++j) {
        acc[j][i] = fmadd_block(block_dot(wq, q + j * K + b * 32), dw * d[j * nb + b], acc[j][i]);
        if constexpr (T == kQ4_1) mins[j][i] += fp16(blk + 2) * sx[j * nb + b];
      }
    }
  }
#pragma GCC unroll 8
  for (int64_t j = 0; j < MR; ++j)
#pragma GCC unroll 8
    for (int64_t i = 0; i < NR; ++i) y[j * ldy + i] = fsum(acc[j][i]) + mins[j][i];
}
#else  // portable
constexpr int64_t kTileTokens = 1, kTileRows = 1;

template <int64_t T, int64_t MR, int64_t NR>
void int_tile(const uint8_t* w, int64_t, const QuantizedActivations& a, int64_t m0, float* y, int64_t) {
  using B = Blk<T>;
  const int16_t* x = a.q.data() + m0 * a.K;
  float acc = 0.f, mins = 0.f;
  for (int64_t b = 0; b < a.nb; ++b, w += B::bytes, x += 32) {
    int32_t dot = 0;
    for (int l = 0; l < 16; ++l) {
      int lo, hi;
      if constexpr (T == kQ8_0) {
        lo = static_cast<int8_t>(w[2 + l]);
        hi = static_cast<int8_t>(w[18 + l]);
      } else {
        const uint8_t* qs = w + (T == kQ4_0 ? 2 : T == kQ4_1 ? 4 : 6);
        lo = qs[l] & 0x0F;
        hi = qs[l] >> 4;
        if constexpr (T == kQ5_0) {
          uint32_t qh;
          std::memcpy(&qh, w + 2, 4);
          lo |= ((qh >> l) & 1) << 4;
          hi |= ((qh >> (l + 16)) & 1) << 4;
        }
        lo -= B::offset;
        hi -= B::offset;
      }
      dot += lo * x[l] + hi * x[l + 16];
    }
    const int64_t ab = m0 * a.nb + b;
    acc += fp16(w) * a.d[ab] * static_cast<float>(dot);
    if constexpr (T == kQ4_1) mins += fp16(w + 2) * a.sx[ab];
  }
  y[0] = acc + mins;
}
#endif

template <int64_t T, int64_t MR, int64_t NR = kTileRows>
void int_tile_n(int64_t rows, const uint8_t* w, int64_t row_bytes, const QuantizedActivations& a, int64_t m0,
                float* y, int64_t ldy) {
  if constexpr (NR > 1) {
    if (rows < NR) return int_tile_n<T, MR, NR - 1>(rows, w, row_bytes, a, m0, y, ldy);
  }
  int_tile<T, MR, NR>(w, row_bytes, a, m0, y, ldy);
}

template <int64_t T, int64_t MR = kTileTokens>
void int_tile_mn(int64_t tokens, int64_t rows, const uint8_t* w, int64_t row_bytes, const QuantizedActivations& a,
                 int64_t m0, float* y, int64_t ldy) {
  if constexpr (MR > 1) {
    if (tokens < MR) return int_tile_mn<T, MR - 1>(tokens, rows, w, row_bytes, a, m0, y, ldy);
  }
  int_tile_n<T, MR>(rows, w, row_bytes, a, m0, y, ldy);
}

constexpr int64_t kTokenBlock = 64;  // tokens whose int16 activations stay in L2 while a thread's rows go by

template <int64_t T>
void int_linear(const uint8_t* w, int64_t N, int64_t row_bytes, const QuantizedActivations& a, int64_t M, float* y) {
  const int64_t tiles = (N + kTileRows - 1) / kTileRows;
  at::parallel_for(0, tiles, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t m0 = 0; m0 < M; m0 += kTokenBlock) {
      const int64_t m1 = std::min(M, m0 + kTokenBlock);
      for (int64_t t = t0; t < t1; ++t) {
        const int64_t n0 = t * kTileRows, rows = std::min(kTileRows, N - n0);
        for (int64_t m = m0; m < m1; m += kTileTokens) {
          int_tile_mn<T>(std::min(kTileTokens, m1 - m), rows, w + n0 * row_bytes, row_bytes, a, m, y + m * N + n0, N);
        }
      }
    }
  });
}

// ---- K-quants: a tile of rows dequantized, then fp32 dot products --------------------------------------
constexpr int64_t kDequantRows = 8;

inline float dot_f32(const float* a, const float* b, int64_t K) {
  float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int64_t k = 0; k < K; k += 8)
    for (int l = 0; l < 8; ++l) s[l] += a[k + l] * b[k + l];
  return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

void dequant_linear(int64_t t, const uint8_t* w, int64_t N, int64_t row_bytes, const float* x, int64_t M, int64_t K,
                    float* y) {
  const int64_t tiles = (N + kDequantRows - 1) / kDequantRows;
  at::parallel_for(0, tiles, 1, [&](int64_t t0, int64_t t1) {
    std::vector<float> buf(kDequantRows * K);
    for (int64_t tile = t0; tile < t1; ++tile) {
      const int64_t n0 = tile * kDequantRows, rows = std::min(kDequantRows, N - n0);
      for (int64_t r = 0; r < rows; ++r) dequantize_row(t, w + (n0 + r) * row_bytes, K, buf.data() + r * K);
      for (int64_t m = 0; m < M; ++m)
        for (int64_t r = 0; r < rows; ++r) y[m * N + n0 + r] = dot_f32(buf.data() + r * K, x + m * K, K);
    }
  });
}

void check_weight(const at::Tensor& data, int64_t qtype, int64_t in_features) {
  const Format f = format_of(qtype);
  TORCH_CHECK(data.scalar_type() == at::kByte && data.dim() == 2 && data.is_contiguous(),
              "quantized weight: expected contiguous uint8 [out_features, row bytes]");
  TORCH_CHECK(in_features % f.block == 0 && data.size(1) == in_features / f.block * f.bytes,
              "quantized weight: ", data.size(1), " bytes a row do not hold ", in_features, " weights of type ", qtype);
}

// x [M, K] fp32; data [N, row bytes] uint8 in ggml's blocks; -> [M, N] (+ bias).
at::Tensor quant_linear(const at::Tensor& x, const at::Tensor& data, int64_t qtype, const std::optional<at::Tensor>& bias) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.dim() == 2, "x: expected fp32 [tokens, in_features]");
  const int64_t M = x.size(0), K = x.size(1), N = data.size(0);
  check_weight(data, qtype, K);
  const auto xc = x.contiguous();
  auto out = at::empty({M, N}, x.options());
  const uint8_t* w = data.data_ptr<uint8_t>();
  const int64_t row_bytes = data.size(1);
  float* y = out.data_ptr<float>();
  if (M > 0) {
    if (modelplex_quant_gemm::prefers_quant_gemm(qtype, M)) {
      modelplex_quant_gemm::quant_gemm_into(xc, data, qtype, nullptr, y);
    } else if (qtype == kQ4_K || qtype == kQ5_K || qtype == kQ6_K) {
      dequant_linear(qtype, w, N, row_bytes, xc.data_ptr<float>(), M, K, y);
    } else {
      thread_local QuantizedActivations a;  // reused: no allocation a call at decode sizes
      quantize_activations(xc.data_ptr<float>(), M, K, a);
      switch (qtype) {
        case kQ8_0: int_linear<kQ8_0>(w, N, row_bytes, a, M, y); break;
        case kQ4_0: int_linear<kQ4_0>(w, N, row_bytes, a, M, y); break;
        case kQ4_1: int_linear<kQ4_1>(w, N, row_bytes, a, M, y); break;
        case kQ5_0: int_linear<kQ5_0>(w, N, row_bytes, a, M, y); break;
        case modelplex_quant::kQ4_0x16:
        case modelplex_quant::kQ4_1x16:
        case modelplex_quant::kQ8_0x16:
          modelplex_quant::group16_linear(qtype, w, N, K, a.q.data(), a.d.data(), a.qsum.data(), M, y);
          break;
        default: TORCH_CHECK(false, "unsupported type");
      }
    }
  }
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->numel() == N, "bias: expected fp32 [out_features]");
    out.add_(*bias);
  }
  return out;
}

// The SwiGLU MLP down(silu(gate(x)) * up(x)) on quantized gate_up ([2 I, K], gate rows first) and down
// ([K', I]) weights: one call where Python made five (two linears, split, silu, mul), with swiglu.h's silu.
at::Tensor quant_silu_mlp(const at::Tensor& x, const at::Tensor& gate_up, int64_t gate_up_type,
                          const at::Tensor& down, int64_t down_type) {
  const at::Tensor h = quant_linear(x, gate_up, gate_up_type, std::nullopt);
  TORCH_CHECK(h.size(1) % 2 == 0, "gate_up: expected an even number of rows (gate, then up)");
  const int64_t inter = h.size(1) / 2;
  at::Tensor act = at::empty({h.size(0), inter}, h.options());
  modelplex_swiglu::silu_and_mul_f32(h.data_ptr<float>(), act.data_ptr<float>(), h.size(0), inter);
  return quant_linear(act, down, down_type, std::nullopt);
}

// data [N, row bytes] -> fp32 [N, K], or only the rows `ids` (an embedding lookup) -> [len(ids), K].
at::Tensor quant_dequantize(const at::Tensor& data, int64_t qtype, int64_t in_features, const std::optional<at::Tensor>& ids) {
  check_weight(data, qtype, in_features);
  const int64_t N = data.size(0), row_bytes = data.size(1), K = in_features;
  at::Tensor rows;
  if (ids.has_value() && ids->defined()) {
    rows = ids->to(at::kLong).contiguous().view({-1});
  } else {
    rows = at::arange(N, at::kLong);
  }
  const int64_t* r = rows.data_ptr<int64_t>();
  const int64_t R = rows.numel();
  for (int64_t i = 0; i < R; ++i) TORCH_CHECK(r[i] >= 0 && r[i] < N, "row ", r[i], " out of range [0, ", N, ")");
  auto out = at::empty({R, K}, at::kFloat);
  const uint8_t* w = data.data_ptr<uint8_t>();
  float* o = out.data_ptr<float>();
  at::parallel_for(0, R, 16, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      if (modelplex_quant::is_group16(qtype)) modelplex_quant::group16_dequantize_row(qtype, w, N, K, r[i], o + i * K);
      else dequantize_row(qtype, w + r[i] * row_bytes, K, o + i * K);
    }
  });
  return out;
}

}  // namespace

void modelplex_quant::quantize_activations16(const float* x, int64_t M, int64_t K, int16_t* q, float* d,
                                             int32_t* qsum) {
  const int64_t nb = K / 32;
  for (int64_t i = 0; i < M * nb; ++i) {
    const int64_t off = (i / nb) * K + (i % nb) * 32;
    float sx;
    quantize_block(x + off, q + off, d + i, &sx, qsum + i);
  }
}

TORCH_LIBRARY_FRAGMENT(modelplex_cpu, m) {
  m.def("quant_linear(Tensor x, Tensor data, int qtype, Tensor? bias) -> Tensor");
  m.def("quant_silu_mlp(Tensor x, Tensor gate_up, int gate_up_type, Tensor down, int down_type) -> Tensor");
  m.def("quant_dequantize(Tensor data, int qtype, int in_features, Tensor? ids) -> Tensor");
}

TORCH_LIBRARY_IMPL(modelplex_cpu, CPU, m) {
  m.impl("quant_linear", &quant_linear);
  m.impl("quant_silu_mlp", &quant_silu_mlp);
  m.impl("quant_dequantize", &quant_dequantize);
}
