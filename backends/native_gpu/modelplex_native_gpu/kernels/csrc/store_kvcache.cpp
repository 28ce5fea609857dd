// Writes a step's keys and values into the paged KV cache on CPU: one call per layer instead of the
// reference's mask check, two index_copy_ calls and their views (about 40 us a layer at one token).
// Reads the cache through its strides, so the contiguous and the head-major layouts both work.

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <torch/library.h>

#include <cstring>

namespace {

void check_pair(const at::Tensor& src, const at::Tensor& cache, const char* name) {
  TORCH_CHECK(src.dim() == 3 && src.stride(2) == 1, name, ": expected [tokens, kv_heads, head_dim] with unit stride");
  TORCH_CHECK(cache.dim() == 4 && cache.stride(3) == 1,
              name, " cache: expected [num_blocks, block_size, kv_heads, head_dim] with unit stride");
  TORCH_CHECK(cache.size(2) == src.size(1) && cache.size(3) == src.size(2), name, ": heads or head size differ from the cache");
  TORCH_CHECK(cache.scalar_type() == src.scalar_type(), name, ": dtype differs from the cache");
}

void store_kvcache(const at::Tensor& key, const at::Tensor& value, at::Tensor k_cache, at::Tensor v_cache,
                   const at::Tensor& slot_mapping) {
  check_pair(key, k_cache, "key");
  check_pair(value, v_cache, "value");
  TORCH_CHECK(value.sizes() == key.sizes(), "key and value shapes differ");
  TORCH_CHECK(slot_mapping.dim() == 1 && slot_mapping.size(0) == key.size(0) && slot_mapping.scalar_type() == at::kLong,
              "slot_mapping: expected int64 [tokens]");
  const auto slots = slot_mapping.contiguous();
  const int64_t* slot = slots.data_ptr<int64_t>();
  const int64_t num_tokens = key.size(0), num_heads = key.size(1), head_dim = key.size(2);
  const int64_t block_size = k_cache.size(1), num_slots = k_cache.size(0) * block_size;
  for (int64_t t = 0; t < num_tokens; ++t) {  // all checked before anything is written
    TORCH_CHECK(slot[t] < num_slots, "slot ", slot[t], " is outside the cache (", num_slots, " slots)");
  }
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, key.scalar_type(), "store_kvcache", [&] {
    const size_t row_bytes = head_dim * sizeof(scalar_t);
    for (const auto& [src, cache] : {std::pair<const at::Tensor&, at::Tensor&>(key, k_cache),
                                     std::pair<const at::Tensor&, at::Tensor&>(value, v_cache)}) {
      const scalar_t* in = src.data_ptr<scalar_t>();
      scalar_t* out = cache.data_ptr<scalar_t>();
      for (int64_t t = 0; t < num_tokens; ++t) {
        if (slot[t] < 0) continue;  // padding
        scalar_t* row = out + (slot[t] / block_size) * cache.stride(0) + (slot[t] % block_size) * cache.stride(1);
        for (int64_t h = 0; h < num_heads; ++h) {
          std::memcpy(row + h * cache.stride(2), in + t * src.stride(0) + h * src.stride(1), row_bytes);
        }
      }
    }
  });
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(modelplex_cpu, m) {
  m.def("store_kvcache(Tensor key, Tensor value, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor slot_mapping) -> ()");
}

TORCH_LIBRARY_IMPL(modelplex_cpu, CPU, m) { m.impl("store_kvcache", &store_kvcache); }
