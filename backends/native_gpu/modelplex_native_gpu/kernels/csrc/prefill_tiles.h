// Prefill attention on AVX-512, register-tiled: one task is 16 query tokens of one sequence x the query heads
// of one KV head (rows r = token * group + head, 16 rows a vector lane each), causal over the sequence's paged
// K/V. Two passes over the keys, as paged_attention.cpp's `attend`: the scores S^T[t][r] of every key the
// tile's last row sees, their softmax, then out[r] = sum_t p[r][t] v_t / l[r].
// - scores: 8 keys x 48 rows in 24 accumulators; a key element (fp32) or a pair of them (bf16, vdpbf16ps:
//   bf16 pairs multiplied exactly, summed in fp32) broadcast against the packed query rows, so no horizontal
//   sums; any head_dim (even at bf16).
// - softmax: per row in the lanes (a key's 16 rows are one vector): max, exp and sum are vertical.
// - values: 6 rows x 64 dims in 24 accumulators, a row's weight broadcast against a key's value row; fp32
//   weights and FMAs at both dtypes (bf16 V widened once a task: rounding p to bf16 would cost the accuracy
//   the tests hold), rows only up to the last key they see.
// Used by prefill_attention when the CPU has AVX-512F (and AVX512_BF16 at bf16) and head_dim % 16 == 0.
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#if defined(__AVX512F__)
#include <immintrin.h>

#include "vec_exp.h"

namespace prefill_tiles {

constexpr int64_t kTileTokens = 16;  // query tokens a task
constexpr int kScoreKeys = 8;        // keys a score register tile
constexpr int kValueRows = 6;        // rows a value register tile
constexpr int64_t kMaxGroup = 16;    // query heads per KV head (row vectors a task)

#if defined(__AVX512BF16__)
constexpr bool kHasBf16Dot = true;
#else
constexpr bool kHasBf16Dot = false;
#endif

template <typename scalar_t>
constexpr bool supported() {
  return std::is_same_v<scalar_t, float> || (std::is_same_v<scalar_t, at::BFloat16> && kHasBf16Dot);
}

// One thread's buffers, reused across its tasks.
struct Scratch {
  std::vector<float> q;   // fp32: q * scale as [D][MP]; bf16: bf16 pairs as [D / 2][MP][2] (in float slots)
  std::vector<float> s;   // S^T then P^T: [n][MP]
  std::vector<float> v;   // bf16 V widened: [n][D]
  std::vector<float> inv_sum;  // [MP]
  std::vector<float> o;   // the rows' outputs: [M][D]
  std::vector<const float*> v_rows;  // each block's V rows (fp32 in the cache, or the widened buffer)
};

// exp(x) for x <= 0, 0 at -inf (Cephes expf: a degree-6 polynomial on |r| <= ln2 / 2, 2^k by scalef).
inline __m512 exp_nonpositive(__m512 x) {
  __m512 k;
  const __m512 y = modelplex_vec::exp_reduced(_mm512_max_ps(x, _mm512_set1_ps(-200.f)), k);  // scalef underflows to 0 there
  return _mm512_scalef_ps(y, k);
}

// In place: x[i][j] becomes x[j][i] (16 x 16 32-bit elements).
inline void transpose16(__m512 (&r)[16]) {
  __m512 t[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {
    r[4 * i] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
    r[4 * i + 1] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
    r[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
    r[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
  }
  for (int i = 0; i < 4; ++i) {
    t[i] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0x88);
    t[i + 4] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0xDD);
    t[i + 8] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0x88);
    t[i + 12] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0xDD);
  }
  for (int i = 0; i < 4; ++i) {
    r[i] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88);
    r[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0xDD);
    r[i + 4] = _mm512_shuffle_f32x4(t[i + 4], t[i + 12], 0x88);
    r[i + 12] = _mm512_shuffle_f32x4(t[i + 4], t[i + 12], 0xDD);
  }
}

// S^T[j][16 v + lane] for keys j < NK (rows k + j * ts) and MV row vectors, fp32: q packed [D][MP], scaled.
template <int MV, int NK>
inline void scores_f32(const float* q, int64_t MP, const float* k, int64_t ts, int64_t D, float* s) {
  __m512 acc[NK][MV];
  for (int j = 0; j < NK; ++j)
    for (int v = 0; v < MV; ++v) acc[j][v] = _mm512_setzero_ps();
  for (int64_t d = 0; d < D; ++d) {
    __m512 qv[MV];
    for (int v = 0; v < MV; ++v) qv[v] = _mm512_loadu_ps(q + d * MP + 16 * v);
    for (int j = 0; j < NK; ++j) {
      const __m512 kb = _mm512_set1_ps(k[j * ts + d]);
      for (int v = 0; v < MV; ++v) acc[j][v] = _mm512_fmadd_ps(qv[v], kb, acc[j][v]);
    }
  }
  for (int j = 0; j < NK; ++j)
    for (int v = 0; v < MV; ++v) _mm512_storeu_ps(s + j * MP + 16 * v, acc[j][v]);
}

#if defined(__AVX512BF16__)
// As scores_f32 at bf16: q packed as bf16 pairs [D / 2][MP][2], unscaled; one vdpbf16ps per pair of dims.
template <int MV, int NK>
inline void scores_bf16(const float* q, int64_t MP, const at::BFloat16* k, int64_t ts, int64_t D, float* s) {
  __m512 acc[NK][MV];
  for (int j = 0; j < NK; ++j)
    for (int v = 0; v < MV; ++v) acc[j][v] = _mm512_setzero_ps();
  for (int64_t d = 0; d < D; d += 2) {
    __m512bh qv[MV];
    for (int v = 0; v < MV; ++v) qv[v] = (__m512bh)_mm512_loadu_ps(q + (d / 2) * MP + 16 * v);
    for (int j = 0; j < NK; ++j) {
      int32_t pair;
      std::memcpy(&pair, k + j * ts + d, 4);
      const __m512bh kb = (__m512bh)_mm512_set1_epi32(pair);
      for (int v = 0; v < MV; ++v) acc[j][v] = _mm512_dpbf16_ps(acc[j][v], qv[v], kb);
    }
  }
  for (int j = 0; j < NK; ++j)
    for (int v = 0; v < MV; ++v) _mm512_storeu_ps(s + j * MP + 16 * v, acc[j][v]);
}
#endif

template <int MV, int NK, typename scalar_t>
inline void scores(const float* q, int64_t MP, const scalar_t* k, int64_t ts, int64_t D, float* s) {
#if defined(__AVX512BF16__)
  if constexpr (std::is_same_v<scalar_t, at::BFloat16>) return scores_bf16<MV, NK>(q, MP, k, ts, D, s);
  else
#endif
  if constexpr (std::is_same_v<scalar_t, float>) scores_f32<MV, NK>(q, MP, k, ts, D, s);
}

// The scores of `n` consecutive keys of one block for row vectors v0 .. v0 + mv - 1.
template <int MV, typename scalar_t>
void score_run(const float* q, int64_t MP, const scalar_t* k, int64_t ts, int64_t n, int64_t D, float* s) {
  int64_t j = 0;
  for (; j + kScoreKeys <= n; j += kScoreKeys) scores<MV, kScoreKeys>(q, MP, k + j * ts, ts, D, s + j * MP);
  for (; j + 4 <= n; j += 4) scores<MV, 4>(q, MP, k + j * ts, ts, D, s + j * MP);
  for (; j < n; ++j) scores<MV, 1>(q, MP, k + j * ts, ts, D, s + j * MP);
}

// out rows (R of them, `ld` apart) = (sum_{t < n} p[t][r] v_t[0:16 NV]) * inv_sum[r]; p = P^T at the group's
// first row, V rows at v_rows[t / bs] + (t % bs) * ts.
template <int R, int NV>
void values(const float* p, int64_t MP, const float* const* v_rows, int64_t ts, int64_t bs, int64_t n,
            const float* inv_sum, float* out, int64_t ld) {
  __m512 acc[R][NV];
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < NV; ++j) acc[r][j] = _mm512_setzero_ps();
  for (int64_t b = 0, t = 0; t < n; ++b) {
    const float* vb = v_rows[b];
    for (const int64_t end = std::min(n, t + bs); t < end; ++t, vb += ts) {
      __m512 vv[NV];
      for (int j = 0; j < NV; ++j) vv[j] = _mm512_loadu_ps(vb + 16 * j);
      for (int r = 0; r < R; ++r) {
        const __m512 pr = _mm512_set1_ps(p[t * MP + r]);
        for (int j = 0; j < NV; ++j) acc[r][j] = _mm512_fmadd_ps(pr, vv[j], acc[r][j]);
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    const __m512 inv = _mm512_set1_ps(inv_sum[r]);
    for (int j = 0; j < NV; ++j) _mm512_storeu_ps(out + r * ld + 16 * j, _mm512_mul_ps(acc[r][j], inv));
  }
}

template <int R>
void values_rows(int64_t nv, const float* p, int64_t MP, const float* const* v_rows, int64_t ts, int64_t bs,
                 int64_t n, const float* inv_sum, float* out, int64_t ld) {
  switch (nv) {
    case 1: return values<R, 1>(p, MP, v_rows, ts, bs, n, inv_sum, out, ld);
    case 2: return values<R, 2>(p, MP, v_rows, ts, bs, n, inv_sum, out, ld);
    case 3: return values<R, 3>(p, MP, v_rows, ts, bs, n, inv_sum, out, ld);
    default: return values<R, 4>(p, MP, v_rows, ts, bs, n, inv_sum, out, ld);
  }
}

// Causal attention of `rows` (<= kTileTokens) consecutive query tokens of one sequence, the first at position
// `first_pos`, for the `group` (<= kMaxGroup) query heads of one KV head, over the K/V blocks `table` lists.
template <typename scalar_t>
void attend_tile(const scalar_t* q, int64_t q_token_stride, int64_t q_head_stride, int64_t rows, int64_t first_pos,
                 const scalar_t* k_base, const scalar_t* v_base, int64_t block_stride, int64_t ts, const int32_t* table,
                 int64_t bs, int64_t group, int64_t D, float scale, Scratch& sc, scalar_t* out,
                 int64_t out_token_stride) {
  constexpr bool kBf16 = std::is_same_v<scalar_t, at::BFloat16>;
  const int64_t M = rows * group, MP = (M + 15) / 16 * 16, MV = MP / 16, n = first_pos + rows;
  const int64_t num_blocks = (n + bs - 1) / bs;
  // The queries: row r = i * group + g in lane r of each dim's (bf16: dim pair's) MP-float row, 16 rows by 16
  // 32-bit elements at a time through a register transpose (padding rows zero).
  sc.q.resize(D * MP);
  const int64_t E = kBf16 ? D / 2 : D;  // 32-bit elements a row
  const __m512 qs = _mm512_set1_ps(kBf16 ? 1.f : scale);
  for (int64_t v = 0; v < MV; ++v)
    for (int64_t e0 = 0; e0 < E; e0 += 16) {
      const int64_t cnt = std::min<int64_t>(16, E - e0);
      const __mmask16 cols = static_cast<__mmask16>(cnt == 16 ? 0xFFFF : (1u << cnt) - 1);
      __m512 x[16];
      for (int64_t i = 0; i < 16; ++i) {
        const int64_t r = 16 * v + i;
        const float* row = reinterpret_cast<const float*>(q + (r / group) * q_token_stride + (r % group) * q_head_stride);
        x[i] = r < M ? _mm512_maskz_loadu_ps(cols, row + e0) : _mm512_setzero_ps();
        if constexpr (!kBf16) x[i] = _mm512_mul_ps(x[i], qs);
      }
      transpose16(x);
      for (int64_t j = 0; j < cnt; ++j) _mm512_storeu_ps(sc.q.data() + (e0 + j) * MP + 16 * v, x[j]);
    }
  sc.s.resize(n * MP);
  float* s = sc.s.data();
  for (int64_t b = 0; b < num_blocks; ++b) {
    const scalar_t* kb = k_base + table[b] * block_stride;
    const int64_t cnt = std::min(bs, n - b * bs);
    for (int64_t v0 = 0; v0 < MV; v0 += 3) {  // 8 keys x 3 row vectors: 24 accumulators
      const float* qv = sc.q.data() + 16 * v0;
      float* sv = s + b * bs * MP + 16 * v0;
      switch (std::min<int64_t>(3, MV - v0)) {
        case 1: score_run<1>(qv, MP, kb, ts, cnt, D, sv); break;
        case 2: score_run<2>(qv, MP, kb, ts, cnt, D, sv); break;
        default: score_run<3>(qv, MP, kb, ts, cnt, D, sv); break;
      }
    }
  }
  // Scale (bf16), the causal mask over the chunk's own keys and each row's max; then p = exp(s - max), its sum.
  __m512 mx[kMaxGroup], sum[kMaxGroup];
  __m512i pos[kMaxGroup];
  for (int64_t v = 0; v < MV; ++v) {
    alignas(64) int32_t lanes[16];  // each row's position (padding rows: the last row's)
    for (int64_t i = 0; i < 16; ++i) lanes[i] = static_cast<int32_t>(first_pos + std::min(M - 1, 16 * v + i) / group);
    pos[v] = _mm512_load_si512(lanes);
    mx[v] = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
    sum[v] = _mm512_setzero_ps();
  }
  const __m512 sf = _mm512_set1_ps(kBf16 ? scale : 1.f), ninf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t t = 0; t < n; ++t)
    for (int64_t v = 0; v < MV; ++v) {
      __m512 x = _mm512_mul_ps(_mm512_loadu_ps(s + t * MP + 16 * v), sf);
      if (t >= first_pos) x = _mm512_mask_mov_ps(ninf, _mm512_cmpge_epi32_mask(pos[v], _mm512_set1_epi32(t)), x);
      _mm512_storeu_ps(s + t * MP + 16 * v, x);
      mx[v] = _mm512_max_ps(mx[v], x);
    }
  for (int64_t t = 0; t < n; ++t)
    for (int64_t v = 0; v < MV; ++v) {
      const __m512 p = exp_nonpositive(_mm512_sub_ps(_mm512_loadu_ps(s + t * MP + 16 * v), mx[v]));
      _mm512_storeu_ps(s + t * MP + 16 * v, p);
      sum[v] = _mm512_add_ps(sum[v], p);
    }
  sc.inv_sum.resize(MP);
  for (int64_t v = 0; v < MV; ++v)
    _mm512_storeu_ps(sc.inv_sum.data() + 16 * v, _mm512_div_ps(_mm512_set1_ps(1.f), sum[v]));
  // V rows: fp32 read in place, bf16 widened once into [n][D].
  sc.v_rows.resize(num_blocks);
  int64_t vts = ts;
  if constexpr (kBf16) {
    sc.v.resize(n * D);
    for (int64_t t = 0; t < n; ++t) {
      const at::BFloat16* src = v_base + table[t / bs] * block_stride + (t % bs) * ts;
      for (int64_t d = 0; d < D; d += 16) {
        const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + d));
        _mm512_storeu_ps(sc.v.data() + t * D + d, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16)));
      }
    }
    vts = D;
  }
  // The rows' outputs in fp32 [M][D], then each to its token and head (bf16 rounded once).
  sc.o.resize(M * D);
  for (int64_t d0 = 0; d0 < D; d0 += 64) {
    for (int64_t b = 0; b < num_blocks; ++b) {
      if constexpr (kBf16) sc.v_rows[b] = sc.v.data() + b * bs * D + d0;
      else sc.v_rows[b] = v_base + table[b] * block_stride + d0;
    }
    const int64_t nv = std::min<int64_t>(4, (D - d0) / 16);
    for (int64_t r0 = 0; r0 < M; r0 += kValueRows) {
      const int64_t keys = first_pos + std::min(M - 1, r0 + kValueRows - 1) / group + 1;  // the group's last row sees
      const float* p = s + r0;
      const float* inv = sc.inv_sum.data() + r0;
      float* dst = sc.o.data() + r0 * D + d0;
      switch (std::min<int64_t>(kValueRows, M - r0)) {
        case 1: values_rows<1>(nv, p, MP, sc.v_rows.data(), vts, bs, keys, inv, dst, D); break;
        case 2: values_rows<2>(nv, p, MP, sc.v_rows.data(), vts, bs, keys, inv, dst, D); break;
        case 3: values_rows<3>(nv, p, MP, sc.v_rows.data(), vts, bs, keys, inv, dst, D); break;
        case 4: values_rows<4>(nv, p, MP, sc.v_rows.data(), vts, bs, keys, inv, dst, D); break;
        case 5: values_rows<5>(nv, p, MP, sc.v_rows.data(), vts, bs, keys, inv, dst, D); break;
        default: values_rows<6>(nv, p, MP, sc.v_rows.data(), vts, bs, keys, inv, dst, D); break;
      }
    }
  }
  for (int64_t r = 0; r < M; ++r) {
    const float* src = sc.o.data() + r * D;
    scalar_t* dst = out + (r / group) * out_token_stride + (r % group) * D;
    if constexpr (kBf16) {
      for (int64_t d = 0; d < D; d += 16)
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + d), (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(src + d)));
    } else {
      std::memcpy(dst, src, D * sizeof(float));
    }
  }
}

}  // namespace prefill_tiles
#endif
