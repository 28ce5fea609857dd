// All the layers of a decode-only step (every row a sequence's one token) on dense weights packed for our fp32
// and bf16 linears, in one parallel region: dense_layer.cpp's op by op path opens one at::parallel_for region per
// op, ~10 a layer (~300 a SmolLM2 step at ~3.5 us each, step_team.h). Here the team stays up for the whole step
// and meets at a spin barrier after each stage (7 a layer): the norms by rows (each thread its share of the rows),
// the products by column panels (each thread its share of the weight's panels, through the panel loop the linear
// ops run: linear_panels.h, linear_bf16_panels.h), gate/up with silu(gate) * up by paired panels (each thread
// gate's columns and the same columns of up, then silu(gate) * up on them), and per thread its sequences' rotary,
// K/V store and attention (at one sequence, its K/V heads'), with no barrier between them. The small ops run
// through the dispatcher on the thread's rows (their at::parallel_for runs inline inside the region). Every output
// is computed by the same arithmetic as the op by op path's, whatever the split: the result is bit for bit its.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/InferenceMode.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <optional>

#include "dense_decode_step.h"
#include "linear_panels.h"
#include "paged_attention.h"
#include "step_team.h"
#include "swiglu.h"

#if defined(__AVX512BF16__) && defined(__AVX512F__)
#include "linear_bf16_panels.h"
#endif

namespace {

#if defined(__AVX512BF16__) && defined(__AVX512F__)
constexpr bool kBf16Panels = true;  // linear_bf16.cpp's ops are built
#else
constexpr bool kBf16Panels = false;
#endif

std::atomic<int64_t> steps_run{0};  // decode_step's steps: the tests check that it ran

template <typename F>
c10::TypedOperatorHandle<F> op(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<F>();
}

// Whether packed is csrc/linear.cpp's (fp32) or csrc/linear_bf16.cpp's (bf16) packing of an [n, k] weight.
bool packed_for(const at::Tensor& packed, at::ScalarType dtype, int64_t n, int64_t k) {
  if (packed.scalar_type() != dtype || !packed.is_contiguous()) return false;
  if (dtype == at::kFloat) {
    return packed.dim() == 3 && packed.size(2) == kPanel && packed.size(1) == k &&
           packed.size(0) == (n + kPanel - 1) / kPanel;
  }
#if defined(__AVX512BF16__) && defined(__AVX512F__)
  constexpr int64_t panel = modelplex_linear_bf16::kPanel;
  return packed.dim() == 4 && packed.size(2) == panel && packed.size(3) == 2 && k % 2 == 0 &&
         packed.size(1) == k / 2 && packed.size(0) == (n + panel - 1) / panel;
#else
  return false;
#endif
}

struct Share {
  int64_t first, count;
};

// part's share of total items split in `parts` as at::parallel_for splits a range.
Share share(int64_t total, int part, int parts) {
  const int64_t chunk = (total + parts - 1) / parts, first = std::min(total, part * chunk);
  return {first, std::min(total - first, chunk)};
}

// Output columns a panel of the packed weight holds.
int64_t panel_width(at::ScalarType dtype) {
#if defined(__AVX512BF16__) && defined(__AVX512F__)
  if (dtype == at::kBFloat16) return modelplex_linear_bf16::kPanel;
#endif
  return kPanel;
}

// y [M, n] (contiguous) columns of the packed weight's panels `panels` = x [M, k] (contiguous) times the packed
// weight transposed: packed_linear's (packed_linear_bf16's) panel loop.
void linear_panels_of(const at::Tensor& x, const at::Tensor& packed, int64_t n, const at::Tensor& y, Share panels) {
  const int64_t M = x.size(0), K = x.size(1), p0 = panels.first, p1 = panels.first + panels.count;
  if (panels.count == 0) return;
  if (x.scalar_type() == at::kFloat) {
    linear_panels(x.data_ptr<float>(), M, K, packed.data_ptr<float>(), n, nullptr, y.data_ptr<float>(), p0, p1);
    return;
  }
#if defined(__AVX512BF16__) && defined(__AVX512F__)
  modelplex_linear_bf16::linear_panels(reinterpret_cast<const uint16_t*>(x.data_ptr<at::BFloat16>()), M,
                                       M == 1 ? 0 : K, reinterpret_cast<const uint16_t*>(packed.data_ptr<at::BFloat16>()),
                                       K / 2, nullptr, reinterpret_cast<uint16_t*>(y.data_ptr<at::BFloat16>()), n, p0, p1);
#endif
}

// This thread's share of the panels.
void linear_part(const at::Tensor& x, const at::Tensor& packed, int64_t n, const at::Tensor& y, int part, int parts) {
  linear_panels_of(x, packed, n, y, share(packed.size(0), part, parts));
}

// act [M, inter] columns [c0, c0 + width) = silu(gate) * up of h [M, 2 inter], every row.
void swiglu_columns(const at::Tensor& h, const at::Tensor& act, int64_t c0, int64_t width) {
  const int64_t M = h.size(0), inter = act.size(1);
  if (h.scalar_type() == at::kFloat) {
    const float* g = h.data_ptr<float>() + c0;
    modelplex_swiglu::silu_and_mul_rows_f32(g, g + inter, 2 * inter, act.data_ptr<float>() + c0, inter, 0, M, width);
  } else {
    const at::BFloat16* g = h.data_ptr<at::BFloat16>() + c0;
    modelplex_swiglu::silu_and_mul_rows_bf16(g, g + inter, 2 * inter, act.data_ptr<at::BFloat16>() + c0, inter, 0, M,
                                             width);
  }
}

// The MLP's gate/up product and silu(gate) * up, gate's and up's columns filling whole panels (P each): the
// thread takes gate's panels [a, b) and up's [a + P, b + P) and runs silu(gate) * up on its own columns right
// after, all rows, with no barrier between.
void gate_up_swiglu(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& h, const at::Tensor& act,
                    int part, int parts) {
  const int64_t n = h.size(1), panel = panel_width(x.scalar_type()), P = n / 2 / panel;
  const Share gate = share(P, part, parts);
  linear_panels_of(x, packed, n, h, gate);
  linear_panels_of(x, packed, n, h, {gate.first + P, gate.count});
  swiglu_columns(h, act, gate.first * panel, gate.count * panel);
}

using Norm = at::Tensor(const at::Tensor&, const at::Tensor&, double);
using AddNorm = void(at::Tensor, at::Tensor, const at::Tensor&, double);
using Rotary = void(at::Tensor, const at::Tensor&, const at::Tensor&);
using Store = void(const at::Tensor&, const at::Tensor&, at::Tensor, at::Tensor, const at::Tensor&);

// A thread's sequences (at fewer sequences than threads, its K/V heads and their query heads): views of the
// step's q/k/v rows, tables and attention output, the same at every layer.
struct AttentionPart {
  bool by_heads;
  int64_t kv0, kv;  // its K/V heads
  at::Tensor qk, q, k, v, cos, sin, slots, block_tables, context_lens, out;
};

// q_k_v [M, (heads + 2 kv heads) * head_dim] -> attn [M, heads * head_dim]; empty where the thread has none.
std::optional<AttentionPart> attention_part(const at::Tensor& q_k_v, const at::Tensor& attn,
                                            const modelplex_dense::DecodeStep& s, int part, int parts) {
  const int64_t M = q_k_v.size(0), nh = s.num_heads, nkv = s.num_kv_heads, group = nh / nkv;
  const int64_t head_dim = q_k_v.size(1) / (nh + 2 * nkv);
  const bool by_heads = M < parts;
  const Share mine = share(by_heads ? nkv : M, part, parts);
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

// The part's rotary, K/V store and attention at one layer (its caches), with no barrier between them.
void attend(const AttentionPart& a, const at::Tensor& k_cache_all, const at::Tensor& v_cache_all, double scale) {
  static const auto rotary = op<Rotary>("modelplex_cpu::rotary_embedding");
  static const auto store = op<Store>("modelplex_cpu::store_kvcache");
  if (a.by_heads) {
    rotary.call(a.q, a.cos, a.sin);
    rotary.call(a.k, a.cos, a.sin);
  } else {
    rotary.call(a.qk, a.cos, a.sin);  // q and k heads side by side: one rotation covers both, as the op by op path
  }
  const at::Tensor k_cache = a.by_heads ? k_cache_all.narrow(2, a.kv0, a.kv) : k_cache_all;
  const at::Tensor v_cache = a.by_heads ? v_cache_all.narrow(2, a.kv0, a.kv) : v_cache_all;
  store.call(a.k, a.v, k_cache, v_cache, a.slots);
  at::Tensor out = a.out;
  modelplex_attention::paged_decode_attention_into(a.q, k_cache, v_cache, a.block_tables, a.context_lens, scale, out);
}

int64_t dense_decode_steps() { return steps_run.load(); }

}  // namespace

at::Tensor modelplex_dense::decode_step(const at::Tensor& x, const Layers& w, const DecodeStep& s) {
  const auto dtype = x.scalar_type();
  const int64_t L = w.qkv.size();
  if (x.dim() != 2 || !x.is_contiguous() || x.size(0) == 0 || L == 0 || s.out_features.size() != 4 ||
      !(dtype == at::kFloat || (kBf16Panels && dtype == at::kBFloat16)) || s.num_kv_heads <= 0 ||
      s.num_heads % s.num_kv_heads != 0) {
    return {};
  }
  const int64_t M = x.size(0), H = x.size(1), n_qkv = s.out_features[0], n_gate_up = s.out_features[2];
  if (n_qkv % (s.num_heads + 2 * s.num_kv_heads) != 0 || s.out_features[1] != H || s.out_features[3] != H ||
      n_gate_up % (2 * panel_width(dtype)) != 0) {
    return {};
  }
  const int64_t head_dim = n_qkv / (s.num_heads + 2 * s.num_kv_heads), inter = n_gate_up / 2;
  for (int64_t i = 0; i < L; ++i) {
    if (!packed_for(w.qkv[i], dtype, n_qkv, H) || !packed_for(w.o[i], dtype, H, s.num_heads * head_dim) ||
        !packed_for(w.gate_up[i], dtype, n_gate_up, H) || !packed_for(w.down[i], dtype, H, inter) ||
        w.k_caches[i].scalar_type() != dtype) {
      return {};
    }
  }
  static const auto norm = op<Norm>("modelplex_cpu::rms_norm");
  static const auto add_norm = op<AddNorm>("modelplex_cpu::fused_add_rms_norm");
  const auto opts = x.options();
  // y: each layer's MLP output, normed in place into the next one's input (the first layer's: the embeddings
  // normed); o_out likewise into the MLP's input.
  const at::Tensor residual = x.clone(), y = at::empty({M, H}, opts), q_k_v = at::empty({M, n_qkv}, opts);
  const at::Tensor attn = at::empty({M, s.num_heads * head_dim}, opts), o_out = at::empty({M, H}, opts);
  const at::Tensor h = at::empty({M, n_gate_up}, opts), act = at::empty({M, inter}, opts);
  int parts = modelplex_team::team_size();
  modelplex_team::SpinBarrier barrier(parts);
  modelplex_team::FirstError error;
  const bool inference = c10::InferenceMode::is_enabled();  // thread-local: the team's threads take the caller's
  auto run = [&](int part) {
    c10::InferenceMode mode(inference);
    const Share rows = share(M, part, parts);
    const at::Tensor y_rows = y.narrow(0, rows.first, rows.count), o_rows = o_out.narrow(0, rows.first, rows.count);
    const at::Tensor residual_rows = residual.narrow(0, rows.first, rows.count);
    std::optional<AttentionPart> attention;
    error.guard([&] { attention = attention_part(q_k_v, attn, s, part, parts); });
    for (int64_t i = 0; i < L; ++i) {
      error.guard([&] {
        if (rows.count == 0) return;
        if (i == 0) {
          y_rows.copy_(norm.call(residual_rows, w.input_norms[0], s.eps));
        } else {
          add_norm.call(y_rows, residual_rows, w.input_norms[i], s.eps);
        }
      });
      barrier.wait();
      error.guard([&] { linear_part(y, w.qkv[i], n_qkv, q_k_v, part, parts); });
      barrier.wait();
      error.guard([&] {
        if (attention) attend(*attention, w.k_caches[i], w.v_caches[i], s.scale);
      });
      barrier.wait();
      error.guard([&] { linear_part(attn, w.o[i], H, o_out, part, parts); });
      barrier.wait();
      error.guard([&] {
        if (rows.count > 0) add_norm.call(o_rows, residual_rows, w.post_norms[i], s.eps);
      });
      barrier.wait();
      error.guard([&] { gate_up_swiglu(o_out, w.gate_up[i], h, act, part, parts); });
      barrier.wait();
      error.guard([&] { linear_part(act, w.down[i], H, y, part, parts); });
      barrier.wait();
    }
  };
  modelplex_team::run_team(parts, barrier, run);
  error.rethrow();
  steps_run.fetch_add(1, std::memory_order_relaxed);
  return y + residual;
}

TORCH_LIBRARY_FRAGMENT(modelplex_cpu, m) {
  m.def("dense_decode_steps() -> int", &dense_decode_steps);  // no tensor to dispatch on: one kernel for all
}
