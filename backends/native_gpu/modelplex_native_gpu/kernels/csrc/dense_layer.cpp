// A Llama decoder layer on dense weights packed for our linears (fp32 panels, csrc/linear.cpp; bf16 panels,
// csrc/linear_bf16.cpp) in one op call, and all of a step's layers in one: the ops the Python layer calls one
// by one (RMSNorm with the residual add, q/k/v, rotary, K/V store, paged attention, o, RMSNorm, gate/up,
// SwiGLU, down), called here through the dispatcher in the same order on the same tensors, so the result is
// bit for bit the Python path's (as decode_layer.cpp does for quantized weights at decode). Any step: the
// decode rows (first) attend with paged_decode_attention, the prefill rows with prefill_attention, as
// layers/attention.py's PagedAttention splits them. A SmolLM2 decode step made ~600 op calls from Python
// at ~3-10 us each; this is one.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/record_function.h>
#include <torch/library.h>

#include "dense_decode_step.h"
#include "paged_attention.h"

#include <atomic>
#include <optional>
#include <vector>

namespace {

std::atomic<int64_t> cut_steps{0};  // steps whose last layer ran for the sample rows alone: the tests check it

template <typename F>
c10::TypedOperatorHandle<F> op(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<F>();
}

using Linear = at::Tensor(const at::Tensor&, const at::Tensor&, int64_t, const std::optional<at::Tensor>&);
using LinearBf16 = at::Tensor(const at::Tensor&, const at::Tensor&, int64_t, const std::optional<at::Tensor>&,
                              std::optional<at::ScalarType>);

// The layer's product on a packed weight, as layers/linear.py's Linear.forward calls it (no bias).
at::Tensor linear(const at::Tensor& x, const at::Tensor& packed, int64_t out_features) {
  if (packed.scalar_type() == at::kBFloat16) {
    // built only where the CPU has AVX512_BF16: looked up on first use
    static const auto bf16 = op<LinearBf16>("modelplex_cpu::packed_linear_bf16");
    return bf16.call(x, packed, out_features, std::nullopt, std::nullopt);
  }
  static const auto fp32 = op<Linear>("modelplex_cpu::packed_linear");
  return fp32.call(x, packed, out_features, std::nullopt);
}

// silu(gate) * up on the gate/up product's rows, as LlamaMLP.forward computes it: the fused op (bf16 and fp32).
at::Tensor swiglu(const at::Tensor& gate_up) {
  static const auto silu_and_mul = op<at::Tensor(const at::Tensor&)>("modelplex_cpu::silu_and_mul");
  return silu_and_mul.call(gate_up);
}

struct Layer {
  const at::Tensor &input_norm, &post_norm, &qkv, &o, &gate_up, &down;
  const at::Tensor &k_cache, &v_cache;
};

// The step's layout (AttentionMetadata): decode rows first, then the prefill rows (their tables undefined
// when there are none, the decode ones likewise).
struct Step {
  double eps;
  c10::ArrayRef<int64_t> out_features;  // qkv, o, gate_up, down
  const at::Tensor &cos, &sin, &slot_mapping;
  int64_t num_decode_tokens;
  const std::optional<at::Tensor> &decode_block_tables, &decode_context_lens;
  const std::optional<at::Tensor> &prefill_block_tables, &prefill_cu_seqlens_q, &prefill_context_lens;
  int64_t num_heads, num_kv_heads;
  double scale;
};

// Decode rows and prefill rows write their halves of one output (no concatenation of the two); the op names
// stay in the profiler's records.
at::Tensor attention(const at::Tensor& q, const Layer& w, const Step& s) {
  const int64_t tokens = q.size(0), nd = s.num_decode_tokens;
  TORCH_CHECK(0 <= nd && nd <= tokens, "num_decode_tokens: ", nd, " of ", tokens, " tokens");
  at::Tensor out = at::empty(q.sizes(), q.options());
  if (nd > 0) {
    TORCH_CHECK(s.decode_block_tables.has_value() && s.decode_context_lens.has_value(), "decode rows without tables");
    RECORD_FUNCTION("modelplex_cpu::paged_decode_attention", std::vector<c10::IValue>());
    at::Tensor decoded = out.narrow(0, 0, nd);
    modelplex_attention::paged_decode_attention_into(q.narrow(0, 0, nd), w.k_cache, w.v_cache,
                                                     *s.decode_block_tables, *s.decode_context_lens, s.scale, decoded);
    if (nd == tokens) return out;
  }
  TORCH_CHECK(s.prefill_block_tables.has_value() && s.prefill_cu_seqlens_q.has_value() &&
              s.prefill_context_lens.has_value(), "prefill rows without tables");
  RECORD_FUNCTION("modelplex_cpu::prefill_attention", std::vector<c10::IValue>());
  at::Tensor prefilled = out.narrow(0, nd, tokens - nd);
  modelplex_attention::prefill_attention_into(q.narrow(0, nd, tokens - nd), w.k_cache, w.v_cache,
                                              *s.prefill_block_tables, *s.prefill_cu_seqlens_q,
                                              *s.prefill_context_lens, s.scale, prefilled);
  return out;
}

// The rows a step's last layer carries past its K/V store when only some rows' hidden states are wanted
// (the rows that sample): every decode row, and the last row of each prefill chunk that sample_rows lists.
// Nothing after the last layer reads the other rows' attention, MLP or residual.
struct Kept {
  at::Tensor rows;                          // int64 [S], ascending: the kept rows of the step
  std::optional<at::Tensor> cu_seqlens_q;  // int32 [num_prefills + 1]: the kept prefill rows, one or none a chunk
};

// The kept rows when sample_rows has that shape (ascending; the decode rows all there; each prefill row the
// last of its chunk); otherwise none (the caller computes every row and selects them after).
std::optional<Kept> kept_rows(const at::Tensor& sample_rows, const Step& s, int64_t tokens) {
  TORCH_CHECK(sample_rows.scalar_type() == at::kLong && sample_rows.dim() == 1, "sample_rows: expected int64 [S]");
  const at::Tensor rows = sample_rows.contiguous();
  const int64_t* r = rows.data_ptr<int64_t>();
  const int64_t S = rows.numel(), nd = s.num_decode_tokens;
  for (int64_t i = 0; i < S; ++i) TORCH_CHECK(r[i] >= 0 && r[i] < tokens, "sample_rows: row ", r[i], " of ", tokens);
  if (S < nd || nd == tokens || !s.prefill_cu_seqlens_q.has_value()) return std::nullopt;
  for (int64_t i = 0; i < nd; ++i)
    if (r[i] != i) return std::nullopt;
  const at::Tensor cu = s.prefill_cu_seqlens_q->contiguous();
  const int32_t* c = cu.data_ptr<int32_t>();
  const int64_t num_prefills = cu.numel() - 1;
  at::Tensor kept_cu = at::empty({num_prefills + 1}, cu.options());
  int32_t* k = kept_cu.data_ptr<int32_t>();
  k[0] = 0;
  int64_t i = nd;
  for (int64_t p = 0; p < num_prefills; ++p) {
    const bool last = c[p + 1] > c[p] && i < S && r[i] == nd + c[p + 1] - 1;
    i += last;
    k[p + 1] = k[p] + last;
  }
  if (i != S) return std::nullopt;
  return Kept{rows, kept_cu};
}

// x: the previous layer's MLP output, undefined at the first layer (whose input norm reads residual alone);
// residual is updated in place (LlamaDecoderLayer.forward). Returns the MLP's output. With `kept`, the rows
// past the K/V store are only those (residual becomes theirs, a new tensor).
at::Tensor layer_forward(at::Tensor x, at::Tensor& residual, const Layer& w, const Step& s,
                         const Kept* kept = nullptr) {
  static const auto norm = op<at::Tensor(const at::Tensor&, const at::Tensor&, double)>("modelplex_cpu::rms_norm");
  static const auto add_norm = op<void(at::Tensor, at::Tensor, const at::Tensor&, double)>("modelplex_cpu::fused_add_rms_norm");
  static const auto rotary = op<void(at::Tensor, const at::Tensor&, const at::Tensor&)>("modelplex_cpu::rotary_embedding");
  static const auto store = op<void(const at::Tensor&, const at::Tensor&, at::Tensor, at::Tensor, const at::Tensor&)>(
      "modelplex_cpu::store_kvcache");
  TORCH_CHECK(w.k_cache.scalar_type() == residual.scalar_type() && w.qkv.scalar_type() == residual.scalar_type(),
              "dense layer: the weights and the K/V cache must be in the activations' dtype");
  const int64_t heads = s.num_heads + 2 * s.num_kv_heads;
  int64_t tokens = residual.size(0);
  if (x.defined()) {
    add_norm.call(x, residual, w.input_norm, s.eps);
  } else {
    x = norm.call(residual, w.input_norm, s.eps);
  }
  const at::Tensor q_k_v = linear(x, w.qkv, s.out_features[0]);
  TORCH_CHECK(q_k_v.size(1) % heads == 0, "qkv: ", q_k_v.size(1), " outputs are not ", heads, " heads");
  const int64_t head_dim = q_k_v.size(1) / heads;
  // q and k heads sit side by side: one rotation covers both
  const at::Tensor qk = q_k_v.narrow(1, 0, (s.num_heads + s.num_kv_heads) * head_dim).view({tokens, -1, head_dim});
  rotary.call(qk, s.cos, s.sin);
  const at::Tensor v = q_k_v.narrow(1, (s.num_heads + s.num_kv_heads) * head_dim, s.num_kv_heads * head_dim)
                           .view({tokens, s.num_kv_heads, head_dim});
  store.call(qk.narrow(1, s.num_heads, s.num_kv_heads), v, w.k_cache, w.v_cache, s.slot_mapping);
  at::Tensor q = qk.narrow(1, 0, s.num_heads);
  if (kept != nullptr) {
    q = q.index_select(0, kept->rows);
    residual = residual.index_select(0, kept->rows);
    tokens = q.size(0);
    if (tokens == 0) return residual.clone();
  }
  const at::Tensor attn = kept == nullptr ? attention(q, w, s) : attention(q, w, Step{
      s.eps, s.out_features, s.cos, s.sin, s.slot_mapping, s.num_decode_tokens, s.decode_block_tables,
      s.decode_context_lens, s.prefill_block_tables, kept->cu_seqlens_q, s.prefill_context_lens, s.num_heads,
      s.num_kv_heads, s.scale});
  at::Tensor out = linear(attn.reshape({tokens, s.num_heads * head_dim}), w.o, s.out_features[1]);
  add_norm.call(out, residual, w.post_norm, s.eps);
  return linear(swiglu(linear(out, w.gate_up, s.out_features[2])), w.down, s.out_features[3]);
}

void check_features(c10::ArrayRef<int64_t> out_features) {
  TORCH_CHECK(out_features.size() == 4, "out_features: expected those of qkv, o, gate_up and down");
}

at::Tensor dense_layer(const std::optional<at::Tensor>& x, at::Tensor residual, const at::Tensor& input_norm,
                       const at::Tensor& post_norm, double eps, const at::Tensor& qkv, const at::Tensor& o,
                       const at::Tensor& gate_up, const at::Tensor& down, c10::ArrayRef<int64_t> out_features,
                       const at::Tensor& cos, const at::Tensor& sin, at::Tensor k_cache, at::Tensor v_cache,
                       const at::Tensor& slot_mapping, int64_t num_decode_tokens,
                       const std::optional<at::Tensor>& decode_block_tables,
                       const std::optional<at::Tensor>& decode_context_lens,
                       const std::optional<at::Tensor>& prefill_block_tables,
                       const std::optional<at::Tensor>& prefill_cu_seqlens_q,
                       const std::optional<at::Tensor>& prefill_context_lens, int64_t num_heads, int64_t num_kv_heads,
                       double scale) {
  check_features(out_features);
  const Step step{eps, out_features, cos, sin, slot_mapping, num_decode_tokens, decode_block_tables,
                  decode_context_lens, prefill_block_tables, prefill_cu_seqlens_q, prefill_context_lens,
                  num_heads, num_kv_heads, scale};
  return layer_forward(x.value_or(at::Tensor()), residual,
                       Layer{input_norm, post_norm, qkv, o, gate_up, down, k_cache, v_cache}, step);
}

// Every layer of the step in turn (LlamaForCausalLM.forward's loop), then x + residual. x: the embeddings.
// A decode-only step runs in one parallel region (dense_decode_step.cpp), with the same result. With
// sample_rows, only those rows of the result (bit for bit the same values): where they are the decode rows and
// the last rows of prefill chunks, the last layer carries only them past its K/V store (a 256-token chunk's
// last layer then attends, projects and runs its MLP for a row or a few instead of 256).
at::Tensor dense_layers(const at::Tensor& x, at::TensorList input_norms, at::TensorList post_norms, double eps,
                        at::TensorList qkv, at::TensorList o, at::TensorList gate_up, at::TensorList down,
                        c10::ArrayRef<int64_t> out_features, const at::Tensor& cos, const at::Tensor& sin,
                        at::TensorList k_caches, at::TensorList v_caches, const at::Tensor& slot_mapping,
                        int64_t num_decode_tokens, const std::optional<at::Tensor>& decode_block_tables,
                        const std::optional<at::Tensor>& decode_context_lens,
                        const std::optional<at::Tensor>& prefill_block_tables,
                        const std::optional<at::Tensor>& prefill_cu_seqlens_q,
                        const std::optional<at::Tensor>& prefill_context_lens, int64_t num_heads,
                        int64_t num_kv_heads, double scale, const std::optional<at::Tensor>& sample_rows) {
  const size_t L = qkv.size();
  TORCH_CHECK(L > 0 && input_norms.size() == L && post_norms.size() == L && o.size() == L && gate_up.size() == L &&
                  down.size() == L && k_caches.size() == L && v_caches.size() == L,
              "dense_layers: one of each per layer");
  check_features(out_features);
  if (x.dim() == 2 && num_decode_tokens == x.size(0) && decode_block_tables.has_value() &&
      decode_context_lens.has_value()) {  // a decode-only step: in one parallel region where it applies
    const at::Tensor out = modelplex_dense::decode_step(
        x, {input_norms, post_norms, qkv, o, gate_up, down, k_caches, v_caches},
        {eps, out_features, cos, sin, slot_mapping, *decode_block_tables, *decode_context_lens, num_heads,
         num_kv_heads, scale});
    if (out.defined()) return sample_rows.has_value() ? out.index_select(0, *sample_rows) : out;
  }
  const Step step{eps, out_features, cos, sin, slot_mapping, num_decode_tokens, decode_block_tables,
                  decode_context_lens, prefill_block_tables, prefill_cu_seqlens_q, prefill_context_lens,
                  num_heads, num_kv_heads, scale};
  const std::optional<Kept> kept = sample_rows.has_value() ? kept_rows(*sample_rows, step, x.size(0)) : std::nullopt;
  at::Tensor h, residual = x.clone();  // the Python path norms the embeddings and adds into them: same values
  for (size_t i = 0; i < L; ++i) {
    h = layer_forward(h, residual, Layer{input_norms[i], post_norms[i], qkv[i], o[i], gate_up[i], down[i],
                                         k_caches[i], v_caches[i]}, step, i + 1 == L && kept ? &*kept : nullptr);
  }
  if (kept) cut_steps.fetch_add(1, std::memory_order_relaxed);
  const at::Tensor out = h + residual;
  return sample_rows.has_value() && !kept ? out.index_select(0, *sample_rows) : out;
}

int64_t dense_cut_steps() { return cut_steps.load(); }

}  // namespace

TORCH_LIBRARY_FRAGMENT(modelplex_cpu, m) {
  m.def("dense_layer(Tensor? x, Tensor(a!) residual, Tensor input_norm, Tensor post_norm, float eps, Tensor qkv, "
        "Tensor o, Tensor gate_up, Tensor down, int[] out_features, Tensor cos, Tensor sin, Tensor(b!) k_cache, "
        "Tensor(c!) v_cache, Tensor slot_mapping, int num_decode_tokens, Tensor? decode_block_tables, "
        "Tensor? decode_context_lens, Tensor? prefill_block_tables, Tensor? prefill_cu_seqlens_q, "
        "Tensor? prefill_context_lens, int num_heads, int num_kv_heads, float scale) -> Tensor");
  m.def("dense_layers(Tensor x, Tensor[] input_norms, Tensor[] post_norms, float eps, Tensor[] qkv, Tensor[] o, "
        "Tensor[] gate_up, Tensor[] down, int[] out_features, Tensor cos, Tensor sin, Tensor(a!)[] k_caches, "
        "Tensor(b!)[] v_caches, Tensor slot_mapping, int num_decode_tokens, Tensor? decode_block_tables, "
        "Tensor? decode_context_lens, Tensor? prefill_block_tables, Tensor? prefill_cu_seqlens_q, "
        "Tensor? prefill_context_lens, int num_heads, int num_kv_heads, float scale, Tensor? sample_rows=None) -> Tensor");
  m.def("dense_cut_steps() -> int", &dense_cut_steps);  // no tensor to dispatch on: one kernel for all
}

TORCH_LIBRARY_IMPL(modelplex_cpu, CPU, m) {
  m.impl("dense_layer", &dense_layer);
  m.impl("dense_layers", &dense_layers);
}
