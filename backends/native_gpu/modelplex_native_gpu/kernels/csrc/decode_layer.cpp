// A Llama decoder layer at decode (one token a sequence), fp32, on GGUF-quantized weights, in one op call:
// the ops the Python layer calls one by one (RMSNorm with the residual add, q/k/v, rotary, K/V store, paged
// attention, o, RMSNorm, the SwiGLU MLP), called here through the dispatcher in the same order on the same
// tensors, so the result is bit for bit the Python path's. At SmolLM2's sizes the Python path's ~15 op calls
// a layer cost more than its attention and norms; this is one.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <optional>

namespace {

template <typename F>
c10::TypedOperatorHandle<F> op(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<F>();
}

// x, residual [T, hidden]: residual += x and x = norm(residual) first (as the layer's add_and_norm); the first
// layer passes zeros as x and its embeddings as residual. Returns the MLP's output; residual is updated.
at::Tensor quant_decode_layer(at::Tensor x, at::Tensor residual, const at::Tensor& input_norm,
                              const at::Tensor& post_norm, double eps, const at::Tensor& qkv, int64_t qkv_type,
                              const at::Tensor& o, int64_t o_type, const at::Tensor& gate_up, int64_t gate_up_type,
                              const at::Tensor& down, int64_t down_type, const at::Tensor& cos, const at::Tensor& sin,
                              at::Tensor k_cache, at::Tensor v_cache, const at::Tensor& slot_mapping,
                              const at::Tensor& block_tables, const at::Tensor& context_lens, int64_t num_heads,
                              int64_t num_kv_heads, double scale) {
  static const auto add_norm = op<void(at::Tensor, at::Tensor, const at::Tensor&, double)>("modelplex_cpu::fused_add_rms_norm");
  static const auto linear = op<at::Tensor(const at::Tensor&, const at::Tensor&, int64_t, const std::optional<at::Tensor>&)>(
      "modelplex_cpu::quant_linear");
  static const auto rotary = op<void(at::Tensor, const at::Tensor&, const at::Tensor&)>("modelplex_cpu::rotary_embedding");
  static const auto store = op<void(const at::Tensor&, const at::Tensor&, at::Tensor, at::Tensor, const at::Tensor&)>(
      "modelplex_cpu::store_kvcache");
  static const auto attend = op<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                           const at::Tensor&, double)>("modelplex_cpu::paged_decode_attention");
  static const auto mlp = op<at::Tensor(const at::Tensor&, const at::Tensor&, int64_t, const at::Tensor&, int64_t)>(
      "modelplex_cpu::quant_silu_mlp");
  const int64_t tokens = x.size(0), heads = num_heads + 2 * num_kv_heads;
  add_norm.call(x, residual, input_norm, eps);
  const at::Tensor q_k_v = linear.call(x, qkv, qkv_type, std::nullopt);
  TORCH_CHECK(q_k_v.size(1) % heads == 0, "qkv: ", q_k_v.size(1), " outputs are not ", heads, " heads");
  const int64_t head_dim = q_k_v.size(1) / heads;
  // q and k heads sit side by side: one rotation covers both
  const at::Tensor qk = q_k_v.narrow(1, 0, (num_heads + num_kv_heads) * head_dim).view({tokens, -1, head_dim});
  rotary.call(qk, cos, sin);
  const at::Tensor v = q_k_v.narrow(1, (num_heads + num_kv_heads) * head_dim, num_kv_heads * head_dim)
                           .view({tokens, num_kv_heads, head_dim});
  store.call(qk.narrow(1, num_heads, num_kv_heads), v, k_cache, v_cache, slot_mapping);
  const at::Tensor attn = attend.call(qk.narrow(1, 0, num_heads), k_cache, v_cache, block_tables, context_lens, scale);
  at::Tensor out = linear.call(attn.reshape({tokens, num_heads * head_dim}), o, o_type, std::nullopt);
  add_norm.call(out, residual, post_norm, eps);
  return mlp.call(out, gate_up, gate_up_type, down, down_type);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(modelplex_cpu, m) {
  m.def("quant_decode_layer(Tensor(a!) x, Tensor(b!) residual, Tensor input_norm, Tensor post_norm, float eps, "
        "Tensor qkv, int qkv_type, Tensor o, int o_type, Tensor gate_up, int gate_up_type, Tensor down, "
        "int down_type, Tensor cos, Tensor sin, Tensor(c!) k_cache, Tensor(d!) v_cache, Tensor slot_mapping, "
        "Tensor block_tables, Tensor context_lens, int num_heads, int num_kv_heads, float scale) -> Tensor");
}

TORCH_LIBRARY_IMPL(modelplex_cpu, CPU, m) {
  m.impl("quant_decode_layer", &quant_decode_layer);
}
