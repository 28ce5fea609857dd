// A decode step's attention stage in a one-region step (dense_decode_step.cpp on packed weights,
// decode_step.cpp on quantized ones): each thread's sequences (at one sequence, its K/V heads), their rotary and
// K/V store called directly on its rows (layer_rows.h: the row functions of the ops themselves) and the attention
// written in place, with no dispatcher call and no barrier between them: the same bits as the ops.
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <optional>

#include "dense_decode_step.h"
#include "layer_rows.h"
#include "paged_attention.h"

namespace modelplex_decode {

struct Share {
  int64_t first, count;
};

// part's share of total items split in `parts` as at::parallel_for splits a range.
inline Share share(int64_t total, int part, int parts) {
  const int64_t chunk = (total + parts - 1) / parts, first = std::min(total, part * chunk);
  return {first, std::min(total - first, chunk)};
}

// A thread's sequences (at fewer sequences than threads, its K/V heads and their query heads): views of the
// step's q/k/v rows, tables and attention output, the same at every layer.
struct AttentionPart {
  bool by_heads;
  int64_t kv0, kv;  // its K/V heads
  at::Tensor qk, q, k, v, cos, sin, slots, block_tables, context_lens, out;
};

// Where the sequences of part k of `parts` begin: the sequences split in contiguous runs whose context lengths
// (what the attention reads, most of its time) plus a fixed cost each add up about alike. Split by count, the
// variable workload's lengths (tens to ~1.6k tokens) left one thread waiting at the barrier after attention.
inline int64_t context_boundary(const int32_t* lens, int64_t M, int k, int parts) {
  constexpr int64_t kSequenceCost = 16;  // rotary, K/V store and the attention's setup, in tokens read
  if (k == 0 || k == parts) return k == 0 ? 0 : M;
  int64_t total = 0;
  for (int64_t i = 0; i < M; ++i) total += lens[i] + kSequenceCost;
  const int64_t target = total * k / parts;
  int64_t before = 0, i = 0;
  for (; i < M && before + lens[i] + kSequenceCost <= target; ++i) before += lens[i] + kSequenceCost;
  // i: the last boundary at or below the target; i + 1 if that one is nearer
  return i < M && before + lens[i] + kSequenceCost - target < target - before ? i + 1 : i;
}

// q_k_v [M, (heads + 2 kv heads) * head_dim] -> attn [M, heads * head_dim]; empty where the thread has none.
inline std::optional<AttentionPart> attention_part(const at::Tensor& q_k_v, const at::Tensor& attn,
                                                   const modelplex_dense::DecodeStep& s, int part, int parts) {
  const int64_t M = q_k_v.size(0), nh = s.num_heads, nkv = s.num_kv_heads, group = nh / nkv;
  const int64_t head_dim = q_k_v.size(1) / (nh + 2 * nkv);
  const bool by_heads = M < parts;
  const int32_t* lens = s.context_lens.data_ptr<int32_t>();
  const int64_t first = context_boundary(lens, M, part, parts);
  const Share mine = by_heads ? share(nkv, part, parts) : Share{first, context_boundary(lens, M, part + 1, parts) - first};
  if (mine.count == 0) return std::nullopt;
  const int64_t t0 = by_heads ? 0 : mine.first, tokens = by_heads ? M : mine.count;
  const int64_t kv0 = by_heads ? mine.first : 0, kv = by_heads ? mine.count : nkv;
  const at::Tensor rows = q_k_v.narrow(0, t0, tokens);
  const at::Tensor qk = rows.narrow(1, 0, (nh + nkv) * head_dim).view({tokens, nh + nkv, head_dim});
  return AttentionPart{by_heads, kv0, kv, qk, qk.narrow(1, kv0 * group, kv * group), qk.narrow(1, nh + kv0, kv),
                       rows.narrow(1, (nh + nkv) * head_dim, nkv * head_dim).view({tokens, nkv, head_dim}).narrow(1, kv0, kv),
                       s.cos.narrow(0, t0, tokens), s.sin.narrow(0, t0, tokens), s.slot_mapping.narrow(0, t0, tokens),
                       s.block_tables.narrow(0, t0, tokens), s.context_lens.narrow(0, t0, tokens),
                       attn.narrow(0, t0, tokens).view({tokens, nh, head_dim}).narrow(1, kv0 * group, kv * group)};
}

// The part's rotary and K/V store at one layer, called directly (the caller checked the shapes and dtypes, and
// the slots with attention_applies). scratch: 3 head_dim floats.
template <typename T>
void rotate_and_store(const AttentionPart& a, const at::Tensor& k_cache, const at::Tensor& v_cache, float* scratch) {
  const int64_t tokens = a.qk.size(0), dim = a.qk.size(2), block_size = k_cache.size(1);
  const int64_t* slots = a.slots.data_ptr<int64_t>();
  const T *cos = a.cos.data_ptr<T>(), *sin = a.sin.data_ptr<T>();
  for (int64_t t = 0; t < tokens; ++t) {
    const T *c = cos + t * dim, *s = sin + t * dim;
    if (a.by_heads) {
      modelplex_rows::rotate_row(a.q.data_ptr<T>() + t * a.q.stride(0), a.q.size(1), a.q.stride(1), dim, c, s, scratch);
      modelplex_rows::rotate_row(a.k.data_ptr<T>() + t * a.k.stride(0), a.k.size(1), a.k.stride(1), dim, c, s, scratch);
    } else {  // q and k heads side by side: one rotation covers both, as the op by op path
      modelplex_rows::rotate_row(a.qk.data_ptr<T>() + t * a.qk.stride(0), a.qk.size(1), a.qk.stride(1), dim, c, s,
                                 scratch);
    }
    if (slots[t] < 0) continue;  // padding
    const int64_t block = slots[t] / block_size, offset = slots[t] % block_size;
    for (const at::Tensor* src : {&a.k, &a.v}) {
      const at::Tensor& cache = src == &a.k ? k_cache : v_cache;
      const T* in = src->data_ptr<T>() + t * src->stride(0);
      T* row = cache.data_ptr<T>() + block * cache.stride(0) + offset * cache.stride(1) + a.kv0 * cache.stride(2);
      for (int64_t h = 0; h < a.kv; ++h) std::memcpy(row + h * cache.stride(2), in + h * src->stride(1), dim * sizeof(T));
    }
  }
}

// The part's rotary, K/V store and attention at one layer (its caches), with no barrier between them.
inline void attend(const AttentionPart& a, const at::Tensor& k_cache, const at::Tensor& v_cache, double scale,
            float* scratch) {
  if (a.qk.scalar_type() == at::kFloat) {
    rotate_and_store<float>(a, k_cache, v_cache, scratch);
  } else {
    rotate_and_store<at::BFloat16>(a, k_cache, v_cache, scratch);
  }
  const at::Tensor k_heads = a.by_heads ? k_cache.narrow(2, a.kv0, a.kv) : k_cache;
  const at::Tensor v_heads = a.by_heads ? v_cache.narrow(2, a.kv0, a.kv) : v_cache;
  at::Tensor out = a.out;
  modelplex_attention::paged_decode_attention_into(a.q, k_heads, v_heads, a.block_tables, a.context_lens, scale, out);
}

// Whether the step's rotary tables, slots and caches are what rotate_and_store reads (the ops' checks, and every
// slot inside every cache).
inline bool attention_applies(at::TensorList k_caches, at::TensorList v_caches, const modelplex_dense::DecodeStep& s,
                              at::ScalarType dtype, int64_t M, int64_t head_dim) {
  for (const auto* t : {&s.cos, &s.sin}) {
    if (t->scalar_type() != dtype || !t->is_contiguous() || t->numel() != M * head_dim) return false;
  }
  const at::Tensor& lens = s.context_lens;
  if (lens.scalar_type() != at::kInt || lens.dim() != 1 || lens.size(0) != M || !lens.is_contiguous()) return false;
  const at::Tensor& slots = s.slot_mapping;
  if (slots.scalar_type() != at::kLong || slots.dim() != 1 || slots.size(0) != M || !slots.is_contiguous()) return false;
  const int64_t max_slot = slots.max().item<int64_t>();
  for (size_t i = 0; i < k_caches.size(); ++i) {
    for (const auto* c : {&k_caches[i], &v_caches[i]}) {
      if (c->scalar_type() != dtype || c->dim() != 4 || c->stride(3) != 1 || c->size(2) != s.num_kv_heads ||
          c->size(3) != head_dim || max_slot >= c->size(0) * c->size(1)) {
        return false;
      }
    }
  }
  return true;
}

}  // namespace modelplex_decode
