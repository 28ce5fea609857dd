// paged_attention.cpp's decode for callers in other sources (dense_layer.cpp's one-region decode step).
#pragma once

#include <ATen/ATen.h>

namespace modelplex_attention {

// paged_decode_attention's result written into out [B, H, D] (rows may be strided, heads side by side):
// query [B, H, D]; k_cache/v_cache [num_blocks, block_size, Hkv, D]; block_tables [B, max_blocks] int32;
// context_lens [B] int32. Its (sequence, KV head) tasks on at::parallel_for (inline inside a parallel region).
void paged_decode_attention_into(const at::Tensor& query, const at::Tensor& k_cache, const at::Tensor& v_cache,
                                 const at::Tensor& block_tables, const at::Tensor& context_lens, double scale,
                                 at::Tensor& out);

}  // namespace modelplex_attention
