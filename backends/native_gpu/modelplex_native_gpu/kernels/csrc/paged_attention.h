// paged_attention.cpp's decode and prefill for callers in other sources (dense_decode_step.cpp's one-region
// decode step; dense_layer.cpp's mixed steps, both halves written into one output).
#pragma once

#include <ATen/ATen.h>

namespace modelplex_attention {

// paged_decode_attention's result written into out [B, H, D] (rows may be strided, heads side by side):
// query [B, H, D]; k_cache/v_cache [num_blocks, block_size, Hkv, D]; block_tables [B, max_blocks] int32;
// context_lens [B] int32. Its (sequence, KV head) tasks on at::parallel_for (inline inside a parallel region).
void paged_decode_attention_into(const at::Tensor& query, const at::Tensor& k_cache, const at::Tensor& v_cache,
                                 const at::Tensor& block_tables, const at::Tensor& context_lens, double scale,
                                 at::Tensor& out);

// prefill_attention's result written into out (contiguous, the query's shape): query [T, H, D], sequence s's
// chunk at rows cu_seqlens_q[s]:cu_seqlens_q[s+1], its last row at position context_lens[s] - 1.
void prefill_attention_into(const at::Tensor& query, const at::Tensor& k_cache, const at::Tensor& v_cache,
                            const at::Tensor& block_tables, const at::Tensor& cu_seqlens_q,
                            const at::Tensor& context_lens, double scale, at::Tensor& out);

}  // namespace modelplex_attention
