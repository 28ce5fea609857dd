// Linear layers on GGUF-quantized weights at batch sizes (prefill, large decode batches): a group of weight
// rows is dequantized to fp32 once (L2-resident) and multiplied with every token of the call by linear.cpp's
// fp32 micro-kernel (linear_tile.h), so the dequantization is amortized over the tokens and the products run
// at the fp32 FMA rate (~1.15-1.2x the fp32 packed linear's time at 64 tokens, the rest is dequantization).
// The roles are swapped from linear.cpp: the tokens' inputs, transposed once into panels of kPanel tokens
// ([K][kPanel]), are the panel; the dequantized weight rows are the broadcast operand. Each output is one FMA
// chain over k in order, as linear.cpp's, so it is bit for bit packed_linear on the dequantized weight
// (fma(w, x, acc) == fma(x, w, acc)), and a token's outputs do not depend on the other tokens on this path.
// quant_linear.cpp hands a call here from quant_gemm_min_tokens on: below it, its integer tiles (int16
// activations) are faster for Q8_0, Q4_0, Q4_1 and Q5_0, so a token's outputs change when its batch crosses
// that size (to the more accurate fp32-activation product); K-quants come here at every batch size.
// Dequantization keeps gguf.quants' operations and order (built with -ffp-contract=off), a block at a time
// per type (AVX-512 where built with it).
#include "quant_gemm.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>
#include <vector>

#if defined(__F16C__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "linear_tile.h"

namespace {

enum QType : int64_t { kQ4_0 = 2, kQ4_1 = 3, kQ5_0 = 6, kQ8_0 = 8, kQ4_K = 12, kQ5_K = 13, kQ6_K = 14 };

inline float fp16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
#if defined(__F16C__)
  return _cvtsh_ss(h);
#else
  return static_cast<float>(c10::Half(h, c10::Half::from_bits()));
#endif
}

#if defined(__AVX512F__)
using I16 = __m512i;  // 16 int32 codes
inline I16 bytes16(const uint8_t* p) {  // 16 unsigned bytes -> int32 lanes
  return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline I16 nib16(I16 b, int shift) { return _mm512_and_si512(_mm512_srli_epi32(b, shift), _mm512_set1_epi32(0x0F)); }
// out[0:16] = d * float(q - offset), or d * float(q) + m: gguf's operations (the multiply, then the add).
inline void store16(float* out, float d, I16 q, int offset) {
  const __m512 v = _mm512_cvtepi32_ps(_mm512_sub_epi32(q, _mm512_set1_epi32(offset)));
  _mm512_storeu_ps(out, _mm512_mul_ps(_mm512_set1_ps(d), v));
}
inline void store16_add(float* out, float d, I16 q, float m) {
  const __m512 v = _mm512_mul_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(q));
  _mm512_storeu_ps(out, _mm512_add_ps(v, _mm512_set1_ps(m)));
}
#endif

// One block of weights to fp32, in the operations and order of gguf.quants' dequantize_blocks (16 lanes at a
// time with AVX-512; the compiler vectorizes the portable loops less well: Q4_0 at ~1 cycle a weight).
template <int64_t T> struct Block;

template <> struct Block<kQ8_0> {
  static constexpr int64_t weights = 32, bytes = 34;
  static void dequantize(const uint8_t* src, float* out) {
    const float d = fp16(src);
#if defined(__AVX512F__)
    for (int h = 0; h < 2; ++h)
      store16(out + 16 * h, d, _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 2 + 16 * h))), 0);
#else
    for (int i = 0; i < 32; ++i) out[i] = d * static_cast<float>(static_cast<int8_t>(src[2 + i]));
#endif
  }
};

template <> struct Block<kQ4_0> {
  static constexpr int64_t weights = 32, bytes = 18;
  static void dequantize(const uint8_t* src, float* out) {
    const float d = fp16(src);
#if defined(__AVX512F__)
    const I16 b = bytes16(src + 2);
    store16(out, d, nib16(b, 0), 8);
    store16(out + 16, d, nib16(b, 4), 8);
#else
    for (int i = 0; i < 16; ++i) {
      out[i] = d * static_cast<float>((src[2 + i] & 0x0F) - 8);
      out[i + 16] = d * static_cast<float>((src[2 + i] >> 4) - 8);
    }
#endif
  }
};

template <> struct Block<kQ4_1> {
  static constexpr int64_t weights = 32, bytes = 20;
  static void dequantize(const uint8_t* src, float* out) {
    const float d = fp16(src), m = fp16(src + 2);
#if defined(__AVX512F__)
    const I16 b = bytes16(src + 4);
    store16_add(out, d, nib16(b, 0), m);
    store16_add(out + 16, d, nib16(b, 4), m);
#else
    for (int i = 0; i < 16; ++i) {
      out[i] = d * static_cast<float>(src[4 + i] & 0x0F) + m;
      out[i + 16] = d * static_cast<float>(src[4 + i] >> 4) + m;
    }
#endif
  }
};

template <> struct Block<kQ5_0> {
  static constexpr int64_t weights = 32, bytes = 22;
  static void dequantize(const uint8_t* src, float* out) {
    const float d = fp16(src);
    uint32_t qh;
    std::memcpy(&qh, src + 2, 4);
#if defined(__AVX512F__)
    const I16 b = bytes16(src + 6), fifth = _mm512_set1_epi32(0x10);
    store16(out, d, _mm512_mask_or_epi32(nib16(b, 0), static_cast<__mmask16>(qh), nib16(b, 0), fifth), 16);
    store16(out + 16, d, _mm512_mask_or_epi32(nib16(b, 4), static_cast<__mmask16>(qh >> 16), nib16(b, 4), fifth), 16);
#else
    for (int i = 0; i < 16; ++i) {
      const int lo = (src[6 + i] & 0x0F) | (((qh >> i) & 1) << 4);
      const int hi = (src[6 + i] >> 4) | (((qh >> (i + 16)) & 1) << 4);
      out[i] = d * static_cast<float>(lo - 16);
      out[i + 16] = d * static_cast<float>(hi - 16);
    }
#endif
  }
};

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

template <bool kFive>  // Q4_K, or Q5_K with a fifth bit from qh
struct BlockK {
  static constexpr int64_t weights = 256, bytes = kFive ? 176 : 144;
  static void dequantize(const uint8_t* src, float* out) {
    const float d = fp16(src), dmin = fp16(src + 2);
    const uint8_t* scales = src + 4;
    const uint8_t* qh = src + 16;
    const uint8_t* qs = src + (kFive ? 48 : 16);
    for (int j = 0; j < 8; ++j) {  // sub-block j: 32 weights, nibble j % 2 of bytes qs[32 (j / 2) ...]
      int sc, m;
      scale_min_k4(j, scales, &sc, &m);
      const float dl = d * static_cast<float>(sc), ml = dmin * static_cast<float>(m);
      const uint8_t* q = qs + (j / 2) * 32;
#if defined(__AVX512F__)
      for (int h = 0; h < 2; ++h) {
        I16 v = nib16(bytes16(q + 16 * h), 4 * (j % 2));
        if constexpr (kFive) {
          const I16 bit = _mm512_and_si512(_mm512_srli_epi32(bytes16(qh + 16 * h), j), _mm512_set1_epi32(1));
          v = _mm512_or_si512(v, _mm512_slli_epi32(bit, 4));
        }
        const __m512 w = _mm512_mul_ps(_mm512_set1_ps(dl), _mm512_cvtepi32_ps(v));
        _mm512_storeu_ps(out + j * 32 + 16 * h, _mm512_sub_ps(w, _mm512_set1_ps(ml)));
      }
#else
      for (int l = 0; l < 32; ++l) {
        int v = (q[l] >> (4 * (j % 2))) & 0x0F;
        if constexpr (kFive) v |= ((qh[l] >> j) & 1) << 4;
        out[j * 32 + l] = dl * static_cast<float>(v) - ml;
      }
#endif
    }
  }
};
template <> struct Block<kQ4_K> : BlockK<false> {};
template <> struct Block<kQ5_K> : BlockK<true> {};

template <> struct Block<kQ6_K> {
  static constexpr int64_t weights = 256, bytes = 210;
  static void dequantize(const uint8_t* src, float* out) {
    const uint8_t* ql = src;
    const uint8_t* qh = src + 128;
    const int8_t* scales = reinterpret_cast<const int8_t*>(src + 192);
    const float d = fp16(src + 208);
    for (int h = 0; h < 2; ++h) {    // half: 128 weights
      for (int s = 0; s < 4; ++s) {  // quarter: 32 weights, a scale each 16
        const uint8_t* lo = ql + h * 64 + (s % 2) * 32;
        const uint8_t* hi = qh + h * 32;
        float* o = out + h * 128 + s * 32;
        for (int g = 0; g < 2; ++g) {
          const float dl = d * static_cast<float>(scales[h * 8 + s * 2 + g]);
#if defined(__AVX512F__)
          const I16 low = nib16(bytes16(lo + 16 * g), 4 * (s / 2));
          const I16 high = _mm512_and_si512(_mm512_srli_epi32(bytes16(hi + 16 * g), 2 * s), _mm512_set1_epi32(3));
          store16(o + 16 * g, dl, _mm512_or_si512(low, _mm512_slli_epi32(high, 4)), 32);
#else
          for (int l = 16 * g; l < 16 * g + 16; ++l) {
            const int q = ((lo[l] >> (4 * (s / 2))) & 0x0F) | (((hi[l] >> (2 * s)) & 3) << 4);
            o[l] = dl * static_cast<float>(q - 32);
          }
#endif
        }
      }
    }
  }
};

// Weight rows per group: the unit of work of a thread, dequantized once (kGroupRows x K floats, L2-resident)
// and then multiplied with every token.
constexpr int64_t kGroupRows = 4 * kRows;

// x packed as pack_linear_weight packs a weight: [ceil(M / kPanel)][K][kPanel], zero columns past M.
at::Tensor pack_tokens(const at::Tensor& x) {
  const int64_t M = x.size(0), K = x.size(1), panels = (M + kPanel - 1) / kPanel;
  auto padded = at::zeros({panels * kPanel, K}, x.options());
  padded.narrow(0, 0, M).copy_(x);
  return padded.view({panels, kPanel, K}).transpose(1, 2).contiguous();
}

template <int64_t T>
void gemm(const float* xp, int64_t M, int64_t K, const uint8_t* w, int64_t N, int64_t row_bytes, const float* bias,
          float* y) {
  using B = Block<T>;
  const int64_t groups = (N + kGroupRows - 1) / kGroupRows, panels = (M + kPanel - 1) / kPanel;
  at::parallel_for(0, groups, 1, [&](int64_t g0, int64_t g1) {
    thread_local std::vector<float> rows_f32;  // reused: a call allocates nothing
    rows_f32.resize(kGroupRows * K);
    float* buf = rows_f32.data();
    float out[kRows][kPanel];  // a tile's outputs, weight rows x tokens
    for (int64_t g = g0; g < g1; ++g) {
      const int64_t n0 = g * kGroupRows, rows = std::min(kGroupRows, N - n0);
      for (int64_t r = 0; r < rows; ++r) {
        const uint8_t* src = w + (n0 + r) * row_bytes;
        float* dst = buf + r * K;
        for (int64_t b = 0; b < K / B::weights; ++b) B::dequantize(src + b * B::bytes, dst + b * B::weights);
      }
      for (int64_t p = 0; p < panels; ++p) {
        const float* panel = xp + p * K * kPanel;
        const int64_t m0 = p * kPanel, tokens = std::min(kPanel, M - m0);
        for (int64_t r = 0; r < rows; r += kRows) {
          const int64_t n = std::min(kRows, rows - r);
          // the group's first tile fetches the next group's blocks (K lines: more than its bytes) into cache
          const float* ahead =
              p == 0 && r == 0 && g + 1 < g1 ? reinterpret_cast<const float*>(w + (n0 + kGroupRows) * row_bytes) : nullptr;
          if (tokens <= kLanes) tile_rows<kRows, true>(n, buf + r * K, K, panel, K, nullptr, out[0], kPanel, ahead);
          else tile_rows(n, buf + r * K, K, panel, K, nullptr, out[0], kPanel, ahead);
          for (int64_t j = 0; j < tokens; ++j) {
            float* yj = y + (m0 + j) * N + n0 + r;
            for (int64_t i = 0; i < n; ++i) yj[i] = bias == nullptr ? out[i][j] : out[i][j] + bias[n0 + r + i];
          }
        }
      }
    }
  });
}

int64_t min_tokens_override() {
  // MODELPLEX_QUANT_GEMM_MIN_TOKENS=n: this path from n tokens on for every type (A/B measurements; a
  // large n keeps the integer tiles everywhere). Read once.
  static const int64_t n = [] {
    const char* v = std::getenv("MODELPLEX_QUANT_GEMM_MIN_TOKENS");
    return v == nullptr || *v == '\0' ? int64_t{-1} : static_cast<int64_t>(std::atoll(v));
  }();
  return n;
}

// x [M, K] fp32; data [N, row bytes] uint8 in ggml's blocks of a type quant_gemm handles; -> [M, N] (+ bias).
at::Tensor quant_gemm(const at::Tensor& x, const at::Tensor& data, int64_t qtype, const std::optional<at::Tensor>& bias) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.dim() == 2, "x: expected fp32 [tokens, in_features]");
  TORCH_CHECK(data.scalar_type() == at::kByte && data.dim() == 2 && data.is_contiguous(),
              "quantized weight: expected contiguous uint8 [out_features, row bytes]");
  const int64_t M = x.size(0), K = x.size(1), N = data.size(0);
  const float* b = nullptr;
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->is_contiguous() && bias->numel() == N,
                "bias: expected fp32 [out_features]");
    b = bias->data_ptr<float>();
  }
  auto out = at::empty({M, N}, x.options());
  if (M > 0) modelplex_quant_gemm::quant_gemm_into(x, data, qtype, b, out.data_ptr<float>());
  return out;
}

}  // namespace

namespace modelplex_quant_gemm {

bool handles(int64_t qtype) {
  switch (qtype) {
    case kQ8_0: case kQ4_0: case kQ4_1: case kQ5_0: case kQ4_K: case kQ5_K: case kQ6_K: return true;
    default: return false;
  }
}

int64_t quant_gemm_min_tokens(int64_t qtype) {
  if (!handles(qtype)) return std::numeric_limits<int64_t>::max();
  const int64_t forced = min_tokens_override();
  if (forced >= 0) return forced;
  // Measured (benchmarks/quant_gemm.py, Zen 5, one thread, 960 x 768): the integer tiles of Q8_0, Q4_0,
  // Q4_1 and Q5_0 are faster up to ~12 tokens (at one token they stream each block once at memory speed;
  // here the dequantization alone costs ~2x that, and a partial token panel computes 16 lanes); K-quants'
  // row-at-a-time dequantization there is slower than this path at any batch, one token included.
  return qtype == kQ4_K || qtype == kQ5_K || qtype == kQ6_K ? 1 : 16;
}

bool prefers_quant_gemm(int64_t qtype, int64_t tokens) { return tokens >= quant_gemm_min_tokens(qtype); }

void quant_gemm_into(const at::Tensor& x, const at::Tensor& data, int64_t qtype, const float* bias, float* y) {
  const int64_t M = x.size(0), K = x.size(1), N = data.size(0), row_bytes = data.size(1);
  int64_t block = 0, bytes = 0;
  switch (qtype) {
    case kQ8_0: block = Block<kQ8_0>::weights, bytes = Block<kQ8_0>::bytes; break;
    case kQ4_0: block = Block<kQ4_0>::weights, bytes = Block<kQ4_0>::bytes; break;
    case kQ4_1: block = Block<kQ4_1>::weights, bytes = Block<kQ4_1>::bytes; break;
    case kQ5_0: block = Block<kQ5_0>::weights, bytes = Block<kQ5_0>::bytes; break;
    case kQ4_K: block = Block<kQ4_K>::weights, bytes = Block<kQ4_K>::bytes; break;
    case kQ5_K: block = Block<kQ5_K>::weights, bytes = Block<kQ5_K>::bytes; break;
    case kQ6_K: block = Block<kQ6_K>::weights, bytes = Block<kQ6_K>::bytes; break;
    default: TORCH_CHECK(false, "quant_gemm: unsupported GGML type ", qtype);
  }
  TORCH_CHECK(K % block == 0 && row_bytes == K / block * bytes, "quantized weight: ", row_bytes,
              " bytes a row do not hold ", K, " weights of type ", qtype);
  const at::Tensor xp = pack_tokens(x.contiguous());
  const float* xs = xp.data_ptr<float>();
  const uint8_t* w = data.data_ptr<uint8_t>();
  switch (qtype) {
    case kQ8_0: gemm<kQ8_0>(xs, M, K, w, N, row_bytes, bias, y); break;
    case kQ4_0: gemm<kQ4_0>(xs, M, K, w, N, row_bytes, bias, y); break;
    case kQ4_1: gemm<kQ4_1>(xs, M, K, w, N, row_bytes, bias, y); break;
    case kQ5_0: gemm<kQ5_0>(xs, M, K, w, N, row_bytes, bias, y); break;
    case kQ4_K: gemm<kQ4_K>(xs, M, K, w, N, row_bytes, bias, y); break;
    case kQ5_K: gemm<kQ5_K>(xs, M, K, w, N, row_bytes, bias, y); break;
    case kQ6_K: gemm<kQ6_K>(xs, M, K, w, N, row_bytes, bias, y); break;
  }
}

}  // namespace modelplex_quant_gemm

TORCH_LIBRARY_FRAGMENT(modelplex_cpu, m) {
  m.def("quant_gemm(Tensor x, Tensor data, int qtype, Tensor? bias) -> Tensor");
  m.def("quant_gemm_min_tokens(int qtype) -> int", &modelplex_quant_gemm::quant_gemm_min_tokens);
}

TORCH_LIBRARY_IMPL(modelplex_cpu, CPU, m) {
  m.impl("quant_gemm", &quant_gemm);
}
