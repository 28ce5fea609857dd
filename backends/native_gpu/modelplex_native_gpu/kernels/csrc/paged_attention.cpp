// Paged attention for the CPU path, K/V read in place from the block-paged cache (no gather copy):
// decode (one query token per sequence, one (sequence, KV head) pair per task on torch's intra-op pool)
// and prefill (a chunk's query tokens, causal over the cached prefix and the chunk: 16 query tokens a task in
// prefill_tiles.h's register tiles on AVX-512, else eight a task in `attend` below).
// Registered as torch.ops.modelplex_cpu.paged_decode_attention and .prefill_attention; see kernels/cpu.py.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "paged_attention.h"
#include "prefill_tiles.h"
#include "vec_exp.h"

namespace {

// Scores of one block's tokens against `group` query heads: scores[g * stride + t] = qf[g] . k_t.
template <typename scalar_t>
void block_scores(const float* qf, const scalar_t* k, int64_t token_stride, int64_t n, int64_t group,
                  int64_t head_dim, float* scores, int64_t stride) {
  for (int64_t t = 0; t < n; ++t)
    for (int64_t g = 0; g < group; ++g) {
      const float* qg = qf + g * head_dim;
      const scalar_t* kt = k + t * token_stride;
      float s = 0.f;
#pragma omp simd reduction(+ : s)
      for (int64_t d = 0; d < head_dim; ++d) s += qg[d] * static_cast<float>(kt[d]);
      scores[g * stride + t] = s;
    }
}

// acc[g] += sum_t p[g * stride + t] * v_t over one block's tokens.
template <typename scalar_t>
void block_values(const float* p, const scalar_t* v, int64_t token_stride, int64_t n, int64_t group,
                  int64_t head_dim, int64_t stride, float* acc) {
  for (int64_t t = 0; t < n; ++t)
    for (int64_t g = 0; g < group; ++g) {
      const float pg = p[g * stride + t];
      const scalar_t* vt = v + t * token_stride;
      float* a = acc + g * head_dim;
#pragma omp simd
      for (int64_t d = 0; d < head_dim; ++d) a[d] += pg * static_cast<float>(vt[d]);
    }
}

#if defined(__AVX2__) && defined(__FMA__)
// fp32 with head_dim % 8 == 0: eight tokens' dot products at a time, reduced with one transpose-add tree
// (no horizontal sum per dot); values accumulated 32 floats at a time in registers.
inline __m256 sum8(__m256 a0, __m256 a1, __m256 a2, __m256 a3, __m256 a4, __m256 a5, __m256 a6, __m256 a7) {
  const __m256 h0 = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
  const __m256 h1 = _mm256_hadd_ps(_mm256_hadd_ps(a4, a5), _mm256_hadd_ps(a6, a7));
  return _mm256_add_ps(_mm256_permute2f128_ps(h0, h1, 0x20), _mm256_permute2f128_ps(h0, h1, 0x31));
}

#if defined(__AVX512F__)
// 16 elements of a K or V row as floats (bf16 widened exactly: its bits are a float's top half).
inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const at::BFloat16* p) {
  const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
}

// AVX-512, head_dim % 16 == 0: 16 dims a step; each token's 16 lanes folded to 8 before the reduction tree.
// Scores the tokens in groups of eight; returns the first token left (the caller does the tail).
template <typename scalar_t>
int64_t block_scores512(const float* qf, const scalar_t* k, int64_t token_stride, int64_t n, int64_t group,
                        int64_t head_dim, float* scores, int64_t stride) {
  int64_t t = 0;
  for (; t + 8 <= n; t += 8) {
    const scalar_t* kt = k + t * token_stride;
    for (int64_t g = 0; g < group; ++g) {
      const float* qg = qf + g * head_dim;
      __m512 a[8];
      for (int j = 0; j < 8; ++j) a[j] = _mm512_setzero_ps();
      for (int64_t d = 0; d < head_dim; d += 16) {
        const __m512 q = _mm512_loadu_ps(qg + d);
        for (int j = 0; j < 8; ++j) a[j] = _mm512_fmadd_ps(q, load16(kt + j * token_stride + d), a[j]);
      }
      __m256 h[8];
      for (int j = 0; j < 8; ++j)
        h[j] = _mm256_add_ps(_mm512_castps512_ps256(a[j]),
                             _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a[j]), 1)));
      _mm256_storeu_ps(scores + g * stride + t, sum8(h[0], h[1], h[2], h[3], h[4], h[5], h[6], h[7]));
    }
  }
  return t;
}
#endif

template <>
void block_scores<float>(const float* qf, const float* k, int64_t token_stride, int64_t n, int64_t group,
                         int64_t head_dim, float* scores, int64_t stride) {
  if (head_dim % 8 != 0) {
    for (int64_t t = 0; t < n; ++t)
      for (int64_t g = 0; g < group; ++g) {
        float s = 0.f;
        for (int64_t d = 0; d < head_dim; ++d) s += qf[g * head_dim + d] * k[t * token_stride + d];
        scores[g * stride + t] = s;
      }
    return;
  }
  int64_t t = 0;
#if defined(__AVX512F__)
  if (head_dim % 16 == 0) t = block_scores512(qf, k, token_stride, n, group, head_dim, scores, stride);
#endif
  for (; t + 8 <= n; t += 8) {
    const float* kt = k + t * token_stride;
    for (int64_t g = 0; g < group; ++g) {
      const float* qg = qf + g * head_dim;
      __m256 a[8];
      for (int j = 0; j < 8; ++j) a[j] = _mm256_setzero_ps();
      for (int64_t d = 0; d < head_dim; d += 8) {
        const __m256 q = _mm256_loadu_ps(qg + d);
        for (int j = 0; j < 8; ++j) a[j] = _mm256_fmadd_ps(q, _mm256_loadu_ps(kt + j * token_stride + d), a[j]);
      }
      _mm256_storeu_ps(scores + g * stride + t, sum8(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7]));
    }
  }
  for (; t < n; ++t)
    for (int64_t g = 0; g < group; ++g) {
      __m256 a = _mm256_setzero_ps();
      for (int64_t d = 0; d < head_dim; d += 8)
        a = _mm256_fmadd_ps(_mm256_loadu_ps(qf + g * head_dim + d), _mm256_loadu_ps(k + t * token_stride + d), a);
      alignas(32) float lanes[8];
      _mm256_store_ps(lanes, a);
      scores[g * stride + t] = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
    }
}

// acc[0:8*NV] += sum_t p[t] * v_t[0:8*NV], the accumulators held in registers.
template <int NV>
inline void accumulate(const float* p, const float* v, int64_t token_stride, int64_t n, float* acc) {
  __m256 a[NV];
  for (int j = 0; j < NV; ++j) a[j] = _mm256_loadu_ps(acc + 8 * j);
  for (int64_t t = 0; t < n; ++t) {
    const __m256 pt = _mm256_set1_ps(p[t]);
    for (int j = 0; j < NV; ++j) a[j] = _mm256_fmadd_ps(pt, _mm256_loadu_ps(v + t * token_stride + 8 * j), a[j]);
  }
  for (int j = 0; j < NV; ++j) _mm256_storeu_ps(acc + 8 * j, a[j]);
}

#if defined(__AVX512F__)
// As `accumulate`, 16 floats a register: the same sums in the same order, half the instructions.
template <int NV>
inline void accumulate512(const float* p, const float* v, int64_t token_stride, int64_t n, float* acc) {
  __m512 a[NV];
  for (int j = 0; j < NV; ++j) a[j] = _mm512_loadu_ps(acc + 16 * j);
  for (int64_t t = 0; t < n; ++t) {
    const __m512 pt = _mm512_set1_ps(p[t]);
    for (int j = 0; j < NV; ++j) a[j] = _mm512_fmadd_ps(pt, _mm512_loadu_ps(v + t * token_stride + 16 * j), a[j]);
  }
  for (int j = 0; j < NV; ++j) _mm512_storeu_ps(acc + 16 * j, a[j]);
}

// As accumulate512<4> for each of G query heads at once (64 dims of each): a token's values are loaded
// once for all G, and the G x 4 accumulator chains are independent, so the FMAs issue back to back
// instead of waiting on each other's latency. Each accumulator sums in token order, as before.
template <int G, typename scalar_t>
inline void accumulate_heads512(const float* p, int64_t p_stride, const scalar_t* v, int64_t token_stride, int64_t n,
                                float* acc, int64_t acc_stride) {
  __m512 a[G][4];
  for (int g = 0; g < G; ++g)
    for (int j = 0; j < 4; ++j) a[g][j] = _mm512_loadu_ps(acc + g * acc_stride + 16 * j);
  for (int64_t t = 0; t < n; ++t) {
    __m512 vt[4];
    for (int j = 0; j < 4; ++j) vt[j] = load16(v + t * token_stride + 16 * j);
    for (int g = 0; g < G; ++g) {
      const __m512 pt = _mm512_set1_ps(p[g * p_stride + t]);
      for (int j = 0; j < 4; ++j) a[g][j] = _mm512_fmadd_ps(pt, vt[j], a[g][j]);
    }
  }
  for (int g = 0; g < G; ++g)
    for (int j = 0; j < 4; ++j) _mm512_storeu_ps(acc + g * acc_stride + 16 * j, a[g][j]);
}
#endif

#if defined(__AVX512F__)
// head_dim % 64 == 0: four query heads (or prefill rows) at a time, 64 dims of each.
template <typename scalar_t>
void block_values512(const float* p, const scalar_t* v, int64_t token_stride, int64_t n, int64_t group,
                     int64_t head_dim, int64_t stride, float* acc) {
  for (int64_t g = 0; g < group; g += 4) {
    const float* pg = p + g * stride;
    for (int64_t d = 0; d < head_dim; d += 64) {
      float* a = acc + g * head_dim + d;
      switch (std::min<int64_t>(4, group - g)) {
        case 1: accumulate_heads512<1>(pg, stride, v + d, token_stride, n, a, head_dim); break;
        case 2: accumulate_heads512<2>(pg, stride, v + d, token_stride, n, a, head_dim); break;
        case 3: accumulate_heads512<3>(pg, stride, v + d, token_stride, n, a, head_dim); break;
        default: accumulate_heads512<4>(pg, stride, v + d, token_stride, n, a, head_dim);
      }
    }
  }
}

// bf16 K/V: widened to fp32 as they are loaded, then the fp32 kernels' arithmetic.
template <>
void block_scores<at::BFloat16>(const float* qf, const at::BFloat16* k, int64_t token_stride, int64_t n,
                                int64_t group, int64_t head_dim, float* scores, int64_t stride) {
  int64_t t = head_dim % 16 == 0 ? block_scores512(qf, k, token_stride, n, group, head_dim, scores, stride) : 0;
  for (; t < n; ++t)
    for (int64_t g = 0; g < group; ++g) {
      const float* qg = qf + g * head_dim;
      const at::BFloat16* kt = k + t * token_stride;
      float s = 0.f;
      for (int64_t d = 0; d < head_dim; ++d) s += qg[d] * static_cast<float>(kt[d]);
      scores[g * stride + t] = s;
    }
}

template <>
void block_values<at::BFloat16>(const float* p, const at::BFloat16* v, int64_t token_stride, int64_t n,
                                int64_t group, int64_t head_dim, int64_t stride, float* acc) {
  if (head_dim % 64 == 0) return block_values512(p, v, token_stride, n, group, head_dim, stride, acc);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t g = 0; g < group; ++g)
      for (int64_t d = 0; d < head_dim; ++d) acc[g * head_dim + d] += p[g * stride + t] * static_cast<float>(v[t * token_stride + d]);
}
#endif

template <>
void block_values<float>(const float* p, const float* v, int64_t token_stride, int64_t n, int64_t group,
                         int64_t head_dim, int64_t stride, float* acc) {
  if (head_dim % 8 != 0) {
    for (int64_t t = 0; t < n; ++t)
      for (int64_t g = 0; g < group; ++g)
        for (int64_t d = 0; d < head_dim; ++d) acc[g * head_dim + d] += p[g * stride + t] * v[t * token_stride + d];
    return;
  }
#if defined(__AVX512F__)
  if (head_dim % 64 == 0) return block_values512(p, v, token_stride, n, group, head_dim, stride, acc);
#endif
  for (int64_t g = 0; g < group; ++g) {
    int64_t d = 0;
#if defined(__AVX512F__)
    for (; d + 64 <= head_dim; d += 64) accumulate512<4>(p + g * stride, v + d, token_stride, n, acc + g * head_dim + d);
#endif
    for (; d + 32 <= head_dim; d += 32) accumulate<4>(p + g * stride, v + d, token_stride, n, acc + g * head_dim + d);
    for (; d < head_dim; d += 8) accumulate<1>(p + g * stride, v + d, token_stride, n, acc + g * head_dim + d);
  }
}

// exp(x) for x <= 0 (Cephes expf: x = n ln2 + r, a degree-6 polynomial for exp(r), 2^n from the exponent bits).
inline __m256 exp_nonpositive(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));  // exp(-87) ~ 1.6e-38: keeps 2^n a normal float
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 y = _mm256_set1_ps(1.9875691500e-4f);
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.3981999507e-3f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(8.3334519073e-3f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(4.1665795894e-2f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.6666665459e-1f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(5.0000001201e-1f));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

// s[t] = exp(s[t] - m) in place; returns the sum.
inline float exp_shifted_sum(float* s, int64_t n, float m) {
  __m256 sum = _mm256_setzero_ps();
  const __m256 mv = _mm256_set1_ps(m);
  int64_t t = 0;
  for (; t + 8 <= n; t += 8) {
    const __m256 e = exp_nonpositive(_mm256_sub_ps(_mm256_loadu_ps(s + t), mv));
    _mm256_storeu_ps(s + t, e);
    sum = _mm256_add_ps(sum, e);
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, sum);
  float total = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
  for (; t < n; ++t) {
    s[t] = std::exp(s[t] - m);
    total += s[t];
  }
  return total;
}

// max(s[0:n]) in eight independent lanes (one running max would wait on each compare's latency).
inline float max_of(const float* s, int64_t n) {
  __m256 m8 = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  int64_t t = 0;
  for (; t + 8 <= n; t += 8) m8 = _mm256_max_ps(m8, _mm256_loadu_ps(s + t));
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, m8);
  float m = lanes[0];
  for (int j = 1; j < 8; ++j) m = std::max(m, lanes[j]);
  for (; t < n; ++t) m = std::max(m, s[t]);
  return m;
}
#else
inline float max_of(const float* s, int64_t n) {
  float m = -std::numeric_limits<float>::infinity();
  for (int64_t t = 0; t < n; ++t) m = std::max(m, s[t]);
  return m;
}

inline float exp_shifted_sum(float* s, int64_t n, float m) {
  float total = 0.f;
  for (int64_t t = 0; t < n; ++t) {
    s[t] = std::exp(s[t] - m);
    total += s[t];
  }
  return total;
}
#endif

// Blocks are scattered (often one 4 KiB page each) and hardware prefetchers stop at page boundaries:
// the next kBlocksAhead blocks are fetched while one is being read.
constexpr int64_t kBlocksAhead = 2;

template <typename scalar_t>
inline void prefetch_block(const scalar_t* x, int64_t n, int64_t token_stride, int64_t head_dim) {
  const int64_t per_line = 64 / sizeof(scalar_t);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t d = 0; d < head_dim; d += per_line) __builtin_prefetch(x + t * token_stride + d);
}

// Causal attention of `rows` consecutive query tokens of one sequence (the first at position `first_pos`)
// for the `group` query heads of one KV head, over the sequence's cached K/V (a prefill chunk's own
// included: the layer stores them first). The rows x group query vectors share each K/V block read, and
// each row sees the positions up to its own. A decode is one row at the sequence's last position.
template <typename scalar_t>
void attend(const scalar_t* q, int64_t q_token_stride, int64_t q_head_stride, int64_t rows, int64_t first_pos,
            const scalar_t* k_base, const scalar_t* v_base, int64_t block_stride, int64_t token_stride,
            const int32_t* table, int64_t block_size, int64_t group, int64_t head_dim, float scale,
            std::vector<float>& scores, std::vector<float>& acc, std::vector<float>& qf, std::vector<float>& inv_sum,
            scalar_t* out, int64_t out_token_stride) {
  const int64_t R = rows * group, n = first_pos + rows;  // query vectors; tokens the last row sees
  scores.resize(R * n);
  inv_sum.resize(R);
  acc.assign(R * head_dim, 0.f);
  qf.resize(R * head_dim);
  for (int64_t i = 0; i < rows; ++i)  // row r = i * group + g: query token i, head g
    for (int64_t g = 0; g < group; ++g)
      for (int64_t d = 0; d < head_dim; ++d)
        qf[(i * group + g) * head_dim + d] = static_cast<float>(q[i * q_token_stride + g * q_head_stride + d]) * scale;
  const int64_t num_blocks = (n + block_size - 1) / block_size;
  auto block = [&](const scalar_t* base, int64_t i) { return base + table[i] * block_stride; };
  auto tokens_in = [&](int64_t i) { return std::min(block_size, n - i * block_size); };
  auto prefetch = [&](const scalar_t* base, int64_t i) {
    if (i < num_blocks) prefetch_block(block(base, i), tokens_in(i), token_stride, head_dim);
  };
  // Pass 1: scores = (q * scale) . k for every token the last row sees.
  for (int64_t i = 0; i < kBlocksAhead; ++i) prefetch(k_base, i);
  for (int64_t i = 0; i < num_blocks; ++i) {
    prefetch(k_base, i + kBlocksAhead);
    block_scores<scalar_t>(qf.data(), block(k_base, i), token_stride, tokens_in(i), R, head_dim,
                           scores.data() + i * block_size, n);
  }
  for (int64_t i = 0; i < kBlocksAhead; ++i) prefetch(v_base, i);  // arrives during the softmax
  // Softmax per row over the positions it sees (normalised at the end; later ones weigh 0), then
  // pass 2: out = sum_t p_t * v_t.
  for (int64_t r = 0; r < R; ++r) {
    float* s = scores.data() + r * n;
    const int64_t len = first_pos + r / group + 1;
    inv_sum[r] = 1.f / exp_shifted_sum(s, len, max_of(s, len));
    std::fill(s + len, s + n, 0.f);
  }
  for (int64_t i = 0; i < num_blocks; ++i) {
    prefetch(v_base, i + kBlocksAhead);
    block_values<scalar_t>(scores.data() + i * block_size, block(v_base, i), token_stride, tokens_in(i), R, head_dim,
                           n, acc.data());
  }
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t g = 0; g < group; ++g) {
      const int64_t r = i * group + g;
      for (int64_t d = 0; d < head_dim; ++d)
        out[i * out_token_stride + g * head_dim + d] = static_cast<scalar_t>(acc[r * head_dim + d] * inv_sum[r]);
    }
}

// Decode: one query token per sequence, K and V read in a single sweep (online softmax, as flash-decoding
// does): each block's scores, then their exponentials against the running max (rescaling what was summed
// before when the max rises), then the block's values, so a block's K and V are fetched together.
// The blocks a thread will read form one stream over its tasks, fetched kDecodeBlocksAhead blocks ahead
// (K and V) across task boundaries: blocks are scattered, and hardware prefetchers stop at their edges.
constexpr int64_t kDecodeBlocksAhead = 4;

// The thread's blocks in reading order: task i = (sequence i / Hkv, KV head i % Hkv), block j of it.
struct BlockCursor {
  int64_t task, block;
};

template <typename scalar_t>
struct DecodeBlocks {
  const scalar_t *k, *v;  // the cache's first block of KV head 0
  int64_t block_stride, token_stride, head_stride, head_dim, block_size, num_kv_heads, max_blocks;
  const int32_t *tables, *lens;

  const scalar_t* at(const scalar_t* base, int64_t task, int64_t block) const {
    const int64_t b = task / num_kv_heads, h = task % num_kv_heads;
    return base + h * head_stride + tables[b * max_blocks + block] * block_stride;
  }
  int64_t tokens_in(int64_t task, int64_t block) const {
    return std::min(block_size, lens[task / num_kv_heads] - block * block_size);
  }
  // Prefetches the cursor's block (K and V) and moves it to the next one (nothing past the last task).
  void prefetch_next(BlockCursor& c, int64_t end) const {
    if (c.task >= end) return;
    const int64_t n = tokens_in(c.task, c.block);
    prefetch_block(at(k, c.task, c.block), n, token_stride, head_dim);
    prefetch_block(at(v, c.task, c.block), n, token_stride, head_dim);
    if ((++c.block) * block_size >= lens[c.task / num_kv_heads]) c = {c.task + 1, 0};
  }
};

// Folds one block's scores s[g * stride + t] (t < n) into the running softmax of query head g: m[g] the
// max so far, l[g] the sum of exp(score - m[g]), acc[g] the values weighed likewise. s becomes the block's
// weights exp(score - m[g]) and acc[g] is rescaled for the new max; the caller then adds the block's values.
inline void online_softmax_block(float* s, int64_t stride, int64_t n, int64_t group, int64_t head_dim, float* m,
                                 float* l, float* acc) {
  for (int64_t g = 0; g < group; ++g) {
    float* sg = s + g * stride;
    const float m_new = std::max(m[g], max_of(sg, n));
    if (m_new > m[g]) {  // the first block: m[g] = -inf, alpha = 0 over an all-zero acc
      const float alpha = std::exp(m[g] - m_new);
      l[g] *= alpha;
      float* a = acc + g * head_dim;
      for (int64_t d = 0; d < head_dim; ++d) a[d] *= alpha;
      m[g] = m_new;
    }
    l[g] += exp_shifted_sum(sg, n, m_new);
  }
}

template <typename scalar_t>
void decode_task(const DecodeBlocks<scalar_t>& kv, int64_t task, const scalar_t* q, int64_t q_head_stride,
                 int64_t group, float scale, float* qf, float* scores, float* acc, float* m, float* l,
                 BlockCursor& ahead, int64_t end, scalar_t* out) {
  const int64_t head_dim = kv.head_dim, block_size = kv.block_size;
  for (int64_t g = 0; g < group; ++g) {
    for (int64_t d = 0; d < head_dim; ++d) qf[g * head_dim + d] = static_cast<float>(q[g * q_head_stride + d]) * scale;
    m[g] = -std::numeric_limits<float>::infinity();
    l[g] = 0.f;
  }
  std::fill(acc, acc + group * head_dim, 0.f);
  const int64_t len = kv.lens[task / kv.num_kv_heads];
  for (int64_t j = 0; j * block_size < len; ++j) {
    kv.prefetch_next(ahead, end);
    const int64_t n = kv.tokens_in(task, j);
    block_scores<scalar_t>(qf, kv.at(kv.k, task, j), kv.token_stride, n, group, head_dim, scores, block_size);
    online_softmax_block(scores, block_size, n, group, head_dim, m, l, acc);
    block_values<scalar_t>(scores, kv.at(kv.v, task, j), kv.token_stride, n, group, head_dim, block_size, acc);
  }
  for (int64_t g = 0; g < group; ++g) {
    const float inv = 1.f / l[g];
    for (int64_t d = 0; d < head_dim; ++d) out[g * head_dim + d] = static_cast<scalar_t>(acc[g * head_dim + d] * inv);
  }
}

#if defined(__AVX512F__)
// exp_nonpositive on 16 lanes: the same operations lane by lane.
inline __m512 exp_nonpositive512(__m512 x) {
  __m512 n;
  const __m512 y = modelplex_vec::exp_reduced(_mm512_max_ps(x, _mm512_set1_ps(-87.0f)), n);
  const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_mul_ps(y, _mm512_castsi512_ps(e));
}

// 16 lanes folded to 8 for the sum8 tree.
inline __m256 fold16(__m512 a) {
  return _mm256_add_ps(_mm512_castps512_ps256(a), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)));
}

#if defined(__AVX512BF16__)
inline __m512bh load32bh(const at::BFloat16* p) { return (__m512bh)_mm512_loadu_si512(p); }

// bf16 K, head_dim 64: s[g * 16 + t] = scale * (q_g . k_t) for t < n, with vdpbf16ps (bf16 pairs multiplied
// exactly and summed in fp32, as the widened FMAs but pairwise) on the unscaled bf16 query.
template <int G>
void chunk_scores_bf16(const __m512bh (&qb)[G][2], const at::BFloat16* k, int64_t token_stride, int64_t n,
                       float scale, float* s) {
  const __m256 sc8 = _mm256_set1_ps(scale);
  int64_t t = 0;
  for (; t + 8 <= n; t += 8)
    for (int g = 0; g < G; ++g) {
      __m512 a[8];
      for (int j = 0; j < 8; ++j) {
        const at::BFloat16* row = k + (t + j) * token_stride;
        a[j] = _mm512_dpbf16_ps(_mm512_dpbf16_ps(_mm512_setzero_ps(), qb[g][0], load32bh(row)), qb[g][1], load32bh(row + 32));
      }
      const __m256 sums = sum8(fold16(a[0]), fold16(a[1]), fold16(a[2]), fold16(a[3]), fold16(a[4]), fold16(a[5]),
                               fold16(a[6]), fold16(a[7]));
      _mm256_storeu_ps(s + g * 16 + t, _mm256_mul_ps(sums, sc8));
    }
  for (; t < n; ++t)
    for (int g = 0; g < G; ++g) {
      const at::BFloat16* row = k + t * token_stride;
      const __m512 a = _mm512_dpbf16_ps(_mm512_dpbf16_ps(_mm512_setzero_ps(), qb[g][0], load32bh(row)), qb[g][1], load32bh(row + 32));
      s[g * 16 + t] = _mm512_reduce_add_ps(a) * scale;
    }
}
#endif

// decode_task for head_dim 64 and G <= 4 query heads per KV head: the G x 64 accumulators stay in registers
// across the whole sequence, and each 16-token chunk's softmax step is one 16-lane vector per head.
// bf16 K goes through vdpbf16ps where the CPU has AVX512_BF16 (half the instructions of widening each row).
template <int G, typename scalar_t>
void decode_task64(const DecodeBlocks<scalar_t>& kv, int64_t task, const scalar_t* q, int64_t q_head_stride,
                   float scale, BlockCursor& ahead, int64_t end, scalar_t* out) {
  constexpr int64_t D = 64, C = 16;  // C: tokens a chunk
  constexpr bool kBf16 = std::is_same_v<scalar_t, at::BFloat16>;
  alignas(64) float qf[G * D], s[G * C];
  __m512 acc[G][4];
  float m[G], l[G];
#if defined(__AVX512BF16__)
  __m512bh qb[G][2];
  if constexpr (kBf16)
    for (int g = 0; g < G; ++g)
      for (int i = 0; i < 2; ++i) qb[g][i] = load32bh(q + g * q_head_stride + 32 * i);
#endif
  for (int g = 0; g < G; ++g) {
    for (int64_t d = 0; d < D; ++d) qf[g * D + d] = static_cast<float>(q[g * q_head_stride + d]) * scale;  // unused by vdpbf16ps
    for (int j = 0; j < 4; ++j) acc[g][j] = _mm512_setzero_ps();
    m[g] = -std::numeric_limits<float>::infinity();
    l[g] = 0.f;
  }
  const int64_t len = kv.lens[task / kv.num_kv_heads], token_stride = kv.token_stride;
  for (int64_t j = 0; j * kv.block_size < len; ++j) {
    kv.prefetch_next(ahead, end);
    const int64_t tokens = kv.tokens_in(task, j);
    const scalar_t *kb = kv.at(kv.k, task, j), *vb = kv.at(kv.v, task, j);
    for (int64_t c = 0; c < tokens; c += C) {
      const int64_t n = std::min(C, tokens - c);
      const scalar_t *kc = kb + c * token_stride, *vc = vb + c * token_stride;
#if defined(__AVX512BF16__)
      if constexpr (kBf16) chunk_scores_bf16<G>(qb, kc, token_stride, n, scale, s);
      else
#endif
      for (int64_t t = block_scores512(qf, kc, token_stride, n, G, D, s, C); t < n; ++t)
        for (int g = 0; g < G; ++g) {
          __m512 a = _mm512_mul_ps(_mm512_load_ps(qf + g * D), load16(kc + t * token_stride));
          for (int i = 1; i < 4; ++i) a = _mm512_fmadd_ps(_mm512_load_ps(qf + g * D + 16 * i), load16(kc + t * token_stride + 16 * i), a);
          s[g * C + t] = _mm512_reduce_add_ps(a);
        }
      const __mmask16 live = static_cast<__mmask16>((1u << n) - 1);
      for (int g = 0; g < G; ++g) {
        const __m512 sg = _mm512_mask_load_ps(_mm512_set1_ps(-std::numeric_limits<float>::infinity()), live, s + g * C);
        const float m_new = std::max(m[g], _mm512_reduce_max_ps(sg));
        // exp(m - m_new): 1 exactly while the max holds; ~1e-38 over the zero sums of the first chunk (m = -inf)
        const __m512 alpha = exp_nonpositive512(_mm512_set1_ps(m[g] - m_new));
        for (int i = 0; i < 4; ++i) acc[g][i] = _mm512_mul_ps(acc[g][i], alpha);
        l[g] *= _mm512_cvtss_f32(alpha);
        m[g] = m_new;
        const __m512 p = _mm512_maskz_mov_ps(live, exp_nonpositive512(_mm512_sub_ps(sg, _mm512_set1_ps(m_new))));
        l[g] += _mm512_reduce_add_ps(p);
        _mm512_store_ps(s + g * C, p);
      }
      for (int64_t t = 0; t < n; ++t) {
        __m512 v[4];
        for (int i = 0; i < 4; ++i) v[i] = load16(vc + t * token_stride + 16 * i);
        for (int g = 0; g < G; ++g) {
          const __m512 pt = _mm512_set1_ps(s[g * C + t]);
          for (int i = 0; i < 4; ++i) acc[g][i] = _mm512_fmadd_ps(pt, v[i], acc[g][i]);
        }
      }
    }
  }
  for (int g = 0; g < G; ++g) {
    alignas(64) float o[D];
    const __m512 inv = _mm512_set1_ps(1.f / l[g]);
    for (int i = 0; i < 4; ++i) _mm512_store_ps(o + 16 * i, _mm512_mul_ps(acc[g][i], inv));
    for (int64_t d = 0; d < D; ++d) out[g * D + d] = static_cast<scalar_t>(o[d]);
  }
}

// Runs decode_task64<G> when it applies (AVX-512, fp32 or bf16, head_dim 64, 1-4 query heads per KV head).
template <typename scalar_t>
bool decode_task_fast(const DecodeBlocks<scalar_t>& kv, int64_t task, const scalar_t* q, int64_t q_head_stride,
                      int64_t group, float scale, BlockCursor& ahead, int64_t end, scalar_t* out) {
  if constexpr (std::is_same_v<scalar_t, float> || std::is_same_v<scalar_t, at::BFloat16>) {
    if (kv.head_dim != 64) return false;
    switch (group) {
      case 1: decode_task64<1>(kv, task, q, q_head_stride, scale, ahead, end, out); return true;
      case 2: decode_task64<2>(kv, task, q, q_head_stride, scale, ahead, end, out); return true;
      case 3: decode_task64<3>(kv, task, q, q_head_stride, scale, ahead, end, out); return true;
      case 4: decode_task64<4>(kv, task, q, q_head_stride, scale, ahead, end, out); return true;
      default: return false;
    }
  }
  return false;
}
#else
template <typename scalar_t>
bool decode_task_fast(const DecodeBlocks<scalar_t>&, int64_t, const scalar_t*, int64_t, int64_t, float, BlockCursor&,
                      int64_t, scalar_t*) {
  return false;
}
#endif

}  // namespace

void modelplex_attention::paged_decode_attention_into(const at::Tensor& query, const at::Tensor& k_cache,
                                                      const at::Tensor& v_cache, const at::Tensor& block_tables,
                                                      const at::Tensor& context_lens, double scale, at::Tensor& out) {
  TORCH_CHECK(query.dim() == 3 && k_cache.dim() == 4 && k_cache.sizes() == v_cache.sizes() &&
              k_cache.strides() == v_cache.strides(), "bad shapes");
  TORCH_CHECK(query.stride(2) == 1 && k_cache.stride(3) == 1, "the head dim must be contiguous");
  TORCH_CHECK(query.scalar_type() == k_cache.scalar_type(), "query and cache dtypes differ");
  TORCH_CHECK(block_tables.scalar_type() == at::kInt && context_lens.scalar_type() == at::kInt, "int32 tables");
  const int64_t batch = query.size(0), num_heads = query.size(1), head_dim = query.size(2);
  const int64_t block_size = k_cache.size(1), num_kv_heads = k_cache.size(2);
  TORCH_CHECK(num_heads % num_kv_heads == 0 && k_cache.size(3) == head_dim, "head counts");
  const int64_t group = num_heads / num_kv_heads;
  auto tables = block_tables.contiguous();
  auto lens = context_lens.contiguous();
  TORCH_CHECK(out.sizes() == query.sizes() && out.scalar_type() == query.scalar_type() && out.stride(2) == 1 &&
              out.stride(1) == head_dim, "out: expected [B, H, D] in the query's dtype, heads side by side");
  const int32_t* table_ptr = tables.data_ptr<int32_t>();
  const int32_t* len_ptr = lens.data_ptr<int32_t>();
  const int64_t max_blocks = tables.size(1);
  const int64_t num_cache_blocks = k_cache.size(0);
  for (int64_t b = 0; b < batch; ++b) {  // checked here: an exception must not leave the parallel region
    TORCH_CHECK(len_ptr[b] >= 1 && len_ptr[b] <= max_blocks * block_size, "context length out of range");
    for (int64_t i = 0; i * block_size < len_ptr[b]; ++i) {
      const int32_t id = table_ptr[b * max_blocks + i];
      TORCH_CHECK(id >= 0 && id < num_cache_blocks, "block id out of range");
    }
  }
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, query.scalar_type(), "paged_decode_attention", [&] {
    const scalar_t* q_ptr = query.data_ptr<scalar_t>();
    scalar_t* out_ptr = out.data_ptr<scalar_t>();
    const DecodeBlocks<scalar_t> kv{k_cache.data_ptr<scalar_t>(), v_cache.data_ptr<scalar_t>(), k_cache.stride(0),
                                    k_cache.stride(1), k_cache.stride(2), head_dim, block_size, num_kv_heads,
                                    max_blocks, table_ptr, len_ptr};
    at::parallel_for(0, batch * num_kv_heads, 1, [&](int64_t begin, int64_t end) {
      // scratch for one task at a time: scaled queries, a block's scores, accumulators, running max and sum
      std::vector<float> scratch(group * (2 * head_dim + block_size + 2));
      float *qf = scratch.data(), *acc = qf + group * head_dim, *scores = acc + group * head_dim;
      float *m = scores + group * block_size, *l = m + group;
      BlockCursor ahead{begin, 0};
      for (int64_t i = 0; i < kDecodeBlocksAhead; ++i) kv.prefetch_next(ahead, end);
      for (int64_t i = begin; i < end; ++i) {
        const int64_t b = i / num_kv_heads, h = i % num_kv_heads;
        const scalar_t* q = q_ptr + b * query.stride(0) + h * group * query.stride(1);
        scalar_t* o = out_ptr + b * out.stride(0) + h * group * head_dim;
        if (!decode_task_fast<scalar_t>(kv, i, q, query.stride(1), group, static_cast<float>(scale), ahead, end, o))
          decode_task<scalar_t>(kv, i, q, query.stride(1), group, static_cast<float>(scale), qf, scores, acc, m, l,
                                ahead, end, o);
      }
    });
  });
}

namespace {

// query [B, H, D]; k_cache/v_cache [num_blocks, block_size, Hkv, D] (any strides, contiguous D);
// block_tables [B, max_blocks] int32; context_lens [B] int32 (>= 1). Returns [B, H, D].
at::Tensor paged_decode_attention(const at::Tensor& query, const at::Tensor& k_cache, const at::Tensor& v_cache,
                                  const at::Tensor& block_tables, const at::Tensor& context_lens, double scale) {
  TORCH_CHECK(query.dim() == 3, "bad shapes");
  auto out = at::empty(query.sizes(), query.options());
  modelplex_attention::paged_decode_attention_into(query, k_cache, v_cache, block_tables, context_lens, scale, out);
  return out;
}

constexpr int64_t kPrefillTileTokens = 8;

// Whether prefill_tiles.h's register-tiled kernel runs this case (AVX-512; bf16 with AVX512_BF16).
template <typename scalar_t>
bool prefill_tiled(int64_t group, int64_t head_dim) {
#if defined(__AVX512F__)
  return prefill_tiles::supported<scalar_t>() && head_dim % 16 == 0 && group <= prefill_tiles::kMaxGroup;
#else
  return false;
#endif
}

// query [T, H, D]: sequence s's chunk at rows cu_seqlens_q[s]:cu_seqlens_q[s+1], its last row at position
// context_lens[s] - 1; K/V as for decode, the chunk's included. Writes out [T, H, D] (contiguous).
void prefill_attention_impl(const at::Tensor& query, const at::Tensor& k_cache, const at::Tensor& v_cache,
                            const at::Tensor& block_tables, const at::Tensor& cu_seqlens_q,
                            const at::Tensor& context_lens, double scale, at::Tensor& out) {
  TORCH_CHECK(query.dim() == 3 && k_cache.dim() == 4 && k_cache.sizes() == v_cache.sizes() &&
              k_cache.strides() == v_cache.strides(), "bad shapes");
  TORCH_CHECK(query.stride(2) == 1 && k_cache.stride(3) == 1, "the head dim must be contiguous");
  TORCH_CHECK(query.scalar_type() == k_cache.scalar_type(), "query and cache dtypes differ");
  TORCH_CHECK(block_tables.scalar_type() == at::kInt && cu_seqlens_q.scalar_type() == at::kInt &&
              context_lens.scalar_type() == at::kInt, "int32 tables");
  const int64_t num_heads = query.size(1), head_dim = query.size(2);
  const int64_t block_size = k_cache.size(1), num_kv_heads = k_cache.size(2);
  TORCH_CHECK(num_heads % num_kv_heads == 0 && k_cache.size(3) == head_dim, "head counts");
  const int64_t group = num_heads / num_kv_heads;
  auto tables = block_tables.contiguous();
  auto cu = cu_seqlens_q.contiguous();
  auto lens = context_lens.contiguous();
  const int64_t num_seqs = lens.size(0), max_blocks = tables.size(1), num_cache_blocks = k_cache.size(0);
  TORCH_CHECK(cu.numel() == num_seqs + 1 && tables.size(0) == num_seqs, "one table and length per sequence");
  const int32_t *table_ptr = tables.data_ptr<int32_t>(), *cu_ptr = cu.data_ptr<int32_t>(), *len_ptr = lens.data_ptr<int32_t>();
  TORCH_CHECK(cu_ptr[0] == 0 && cu_ptr[num_seqs] == query.size(0), "cu_seqlens_q must cover the query rows");
  bool tiled = false;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, query.scalar_type(), "prefill_tiled",
                                  [&] { tiled = prefill_tiled<scalar_t>(group, head_dim); });
#if defined(__AVX512F__)
  const int64_t tile_tokens = tiled ? prefill_tiles::kTileTokens : kPrefillTileTokens;
#else
  const int64_t tile_tokens = kPrefillTileTokens;
#endif
  // Tasks: (sequence, KV head, tile of query tokens), checked here (an exception must not leave the
  // parallel region).
  std::vector<std::array<int64_t, 5>> tasks;  // cost, sequence, head, first row, rows
  for (int64_t s = 0; s < num_seqs; ++s) {
    const int64_t q_len = cu_ptr[s + 1] - cu_ptr[s], ctx = len_ptr[s];
    TORCH_CHECK(q_len >= 0 && q_len <= ctx && ctx <= max_blocks * block_size, "context length out of range");
    for (int64_t i = 0; i * block_size < ctx; ++i) {
      const int32_t id = table_ptr[s * max_blocks + i];
      TORCH_CHECK(id >= 0 && id < num_cache_blocks, "block id out of range");
    }
    for (int64_t h = 0; h < num_kv_heads; ++h)
      for (int64_t j = 0; j < q_len; j += tile_tokens) {
        const int64_t rows = std::min(tile_tokens, q_len - j);
        tasks.push_back({rows * (ctx - q_len + j + rows), s, h, j, rows});
      }
  }
  // Costliest first, each thread taking the next task when it is done with one (causal tiles cost more the
  // later they sit; a static split left one thread idle while the other finished).
  std::sort(tasks.begin(), tasks.end(), [](const auto& a, const auto& b) { return a[0] > b[0]; });
  std::atomic<int64_t> next{0};
  const int64_t num_tasks = static_cast<int64_t>(tasks.size());
  TORCH_CHECK(out.is_contiguous() && out.sizes() == query.sizes() && out.scalar_type() == query.scalar_type(),
              "out: expected a contiguous tensor of the query's shape and dtype");
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, query.scalar_type(), "prefill_attention", [&] {
    const scalar_t* q_ptr = query.data_ptr<scalar_t>();
    const scalar_t* k_ptr = k_cache.data_ptr<scalar_t>();
    const scalar_t* v_ptr = v_cache.data_ptr<scalar_t>();
    scalar_t* out_ptr = out.data_ptr<scalar_t>();
    at::parallel_for(0, std::min<int64_t>(num_tasks, at::get_num_threads()), 1, [&](int64_t, int64_t) {
      std::vector<float> scores, acc, qf, inv_sum;
#if defined(__AVX512F__)
      prefill_tiles::Scratch scratch;
#endif
      for (int64_t t = next++; t < num_tasks; t = next++) {
        const int64_t s = tasks[t][1], h = tasks[t][2], j = tasks[t][3], rows = tasks[t][4];
        const int64_t row = cu_ptr[s] + j, first_pos = len_ptr[s] - (cu_ptr[s + 1] - cu_ptr[s]) + j;
        const scalar_t* q = q_ptr + row * query.stride(0) + h * group * query.stride(1);
        scalar_t* o = out_ptr + row * num_heads * head_dim + h * group * head_dim;
#if defined(__AVX512F__)
        if constexpr (prefill_tiles::supported<scalar_t>()) {
          if (tiled) {
            prefill_tiles::attend_tile<scalar_t>(q, query.stride(0), query.stride(1), rows, first_pos,
                                                 k_ptr + h * k_cache.stride(2), v_ptr + h * v_cache.stride(2),
                                                 k_cache.stride(0), k_cache.stride(1), table_ptr + s * max_blocks,
                                                 block_size, group, head_dim, static_cast<float>(scale), scratch, o,
                                                 num_heads * head_dim);
            continue;
          }
        }
#endif
        attend<scalar_t>(q, query.stride(0), query.stride(1), rows, first_pos, k_ptr + h * k_cache.stride(2),
                         v_ptr + h * v_cache.stride(2), k_cache.stride(0), k_cache.stride(1),
                         table_ptr + s * max_blocks, block_size, group, head_dim, static_cast<float>(scale), scores,
                         acc, qf, inv_sum, o, num_heads * head_dim);
      }
    });
  });
}

at::Tensor prefill_attention(const at::Tensor& query, const at::Tensor& k_cache, const at::Tensor& v_cache,
                             const at::Tensor& block_tables, const at::Tensor& cu_seqlens_q,
                             const at::Tensor& context_lens, double scale) {
  auto out = at::empty_like(query, at::MemoryFormat::Contiguous);
  prefill_attention_impl(query, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, scale, out);
  return out;
}

}  // namespace

void modelplex_attention::prefill_attention_into(const at::Tensor& query, const at::Tensor& k_cache,
                                                 const at::Tensor& v_cache, const at::Tensor& block_tables,
                                                 const at::Tensor& cu_seqlens_q, const at::Tensor& context_lens,
                                                 double scale, at::Tensor& out) {
  prefill_attention_impl(query, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, scale, out);
}

TORCH_LIBRARY(modelplex_cpu, m) {
  m.def("paged_decode_attention(Tensor query, Tensor k_cache, Tensor v_cache, Tensor block_tables, "
        "Tensor context_lens, float scale) -> Tensor");
  m.def("prefill_attention(Tensor query, Tensor k_cache, Tensor v_cache, Tensor block_tables, "
        "Tensor cu_seqlens_q, Tensor context_lens, float scale) -> Tensor");
}

TORCH_LIBRARY_IMPL(modelplex_cpu, CPU, m) {
  m.impl("paged_decode_attention", &paged_decode_attention);
  m.impl("prefill_attention", &prefill_attention);
}
