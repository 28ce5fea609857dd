// All the layers of a decode-only step (every row a sequence's one token) on dense weights packed for our fp32
// and bf16 linears, in one parallel region: dense_layer.cpp's op by op path opens one at::parallel_for region per
// op, ~10 a layer (~300 a SmolLM2 step at ~3.5 us each, step_team.h). Here the team stays up for the whole step
// and meets at a spin barrier after each stage (7 a layer): the norms by rows (each thread its share of the rows),
// the products by column panels (each thread its share of the weight's panels, through the panel loop the linear
// ops run: linear_panels.h, linear_bf16_panels.h), gate/up with silu(gate) * up by paired panels (each thread
// gate's columns and the same columns of up, then silu(gate) * up on them), and per thread its sequences' rotary,
// K/V store and attention (its run of sequences split by context length; at one sequence, its K/V heads'), with
// no barrier between them. The norms, rotary and
// K/V store are called directly on the thread's rows (layer_rows.h: the row functions of the ops themselves), not
// through the dispatcher. Every output is computed by the same arithmetic as the op by op path's, whatever the
// split: the result is bit for bit its.
#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <optional>
#include <vector>

#include "decode_attention.h"
#include "dense_decode_step.h"
#include "layer_rows.h"
#include "linear_panels.h"
#include "paged_attention.h"
#include "step_team.h"
#include "swiglu.h"

#if defined(__AVX512BF16__) && defined(__AVX512F__)
#include "linear_bf16_panels.h"
#endif

namespace {

using modelplex_decode::AttentionPart;
using modelplex_decode::Share;
using modelplex_decode::attention_applies;
using modelplex_decode::share;

#if defined(__AVX512BF16__) && defined(__AVX512F__)
constexpr bool kBf16Panels = true;  // linear_bf16.cpp's ops are built
#else
constexpr bool kBf16Panels = false;
#endif

std::atomic<int64_t> steps_run{0};  // decode_step's steps: the tests check that it ran

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

// The thread's rows of a layer's norm: x = RMSNorm(residual) at the first layer (add false), else residual += x,
// x = RMSNorm(residual); rows [M, n] contiguous. xf: n floats of scratch.
template <typename T>
void norm_rows(const at::Tensor& x, const at::Tensor& residual, const at::Tensor& weight, double eps, bool add,
               Share rows, float* xf) {
  const int64_t n = x.size(1);
  T *xs = x.data_ptr<T>(), *rs = residual.data_ptr<T>();
  const T* w = weight.data_ptr<T>();
  for (int64_t t = rows.first; t < rows.first + rows.count; ++t) {
    if (add) {
      modelplex_rows::add_rms_norm_row(xs + t * n, rs + t * n, w, n, eps, xf);
    } else {
      modelplex_rows::rms_norm_row(rs + t * n, w, xs + t * n, n, eps, xf);
    }
  }
}

// Whether the step's norms are what norm_rows reads and its rotary tables, slots and caches what the attention
// part reads (the ops' checks).
bool small_ops_apply(const modelplex_dense::Layers& w, const modelplex_dense::DecodeStep& s, at::ScalarType dtype,
                     int64_t M, int64_t H, int64_t head_dim) {
  for (int64_t i = 0; i < static_cast<int64_t>(w.qkv.size()); ++i) {
    for (const auto* n : {&w.input_norms[i], &w.post_norms[i]}) {
      if (n->scalar_type() != dtype || n->dim() != 1 || !n->is_contiguous() || n->size(0) != H) return false;
    }
  }
  return attention_applies(w.k_caches, w.v_caches, s, dtype, M, head_dim);
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
  if (!small_ops_apply(w, s, dtype, M, H, head_dim)) return {};
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
  const auto norm = dtype == at::kFloat ? norm_rows<float> : norm_rows<at::BFloat16>;
  auto run = [&](int part) {
    c10::InferenceMode mode(inference);
    const Share rows = share(M, part, parts);
    std::vector<float> scratch(std::max(H, 3 * head_dim));
    std::optional<AttentionPart> attention;
    error.guard([&] { attention = modelplex_decode::attention_part(q_k_v, attn, s, part, parts); });
    for (int64_t i = 0; i < L; ++i) {
      error.guard([&] { norm(y, residual, w.input_norms[i], s.eps, i > 0, rows, scratch.data()); });
      barrier.wait();
      error.guard([&] { linear_part(y, w.qkv[i], n_qkv, q_k_v, part, parts); });
      barrier.wait();
      error.guard([&] {
        if (attention) modelplex_decode::attend(*attention, w.k_caches[i], w.v_caches[i], s.scale, scratch.data());
      });
      barrier.wait();
      error.guard([&] { linear_part(attn, w.o[i], H, o_out, part, parts); });
      barrier.wait();
      error.guard([&] { norm(o_out, residual, w.post_norms[i], s.eps, true, rows, scratch.data()); });
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
