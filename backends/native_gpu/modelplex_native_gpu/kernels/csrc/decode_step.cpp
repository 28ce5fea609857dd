// All the decoder layers of a decode step (one token a sequence, fp32, weights in the 16-row group layouts of
// quant_repack.cpp) in one op call and one parallel region. Per layer, decode_layer.cpp's ops open five
// parallel regions (q/k/v, attention, o, gate/up, down); a fork and join of torch's OpenMP pool measured
// ~3.5 us on this 2-core machine (64K-float add: 4.4 us on 1 thread, 5.7 us on 2), ~150 of them a SmolLM2
// step, a fifth of it. Here the team stays up for the whole step and meets at a spin barrier (llama.cpp's
// threads do the same) after each product. Each thread keeps its own copy of the residual stream and
// computes the norms and the int16 activations of q/k/v's, o's and gate/up's inputs itself (the same ops on the
// same values as decode_layer.cpp's, so every copy holds the same bits), then multiplies its share of the
// weight's groups, split as at::parallel_for splits them (gate/up: the same groups of each, then silu(gate) * up
// and the down projection's int16 activations of its own columns, gate_up_silu), and rotates, stores and
// attends with its share of the sequences (at one sequence, of the K/V heads). The norms, rotary and K/V store
// are called directly on the rows (decode_attention.h, layer_rows.h: the ops' own row functions), not through
// the dispatcher: through it, with the views each layer cut, the attention stage took ~23 us a layer of a 1B
// model's single-stream step, ~4% of it with the memory idle (paired, 1B Q4_0: +3% tok/s).
// Every result is bit for bit decode_layer.cpp's.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/InferenceMode.h>
#include <torch/library.h>

#include "decode_attention.h"
#include "layer_rows.h"
#include "quant_gemm.h"
#include "quant_repack.h"
#include "step_team.h"
#include "swiglu.h"

#include <atomic>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <optional>
#include <vector>

namespace {

template <typename F>
c10::TypedOperatorHandle<F> op(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<F>();
}

using modelplex_team::SpinBarrier;

std::atomic<int64_t> region_steps{0};  // steps run in the one region (not layer by layer): the tests check it

// One thread's int16 activations.
struct Activations {
  std::vector<int16_t> q;
  std::vector<float> d;
  std::vector<int32_t> qsum;
};

// y [M, N] (shared) = x [M, K] times w: this thread's part of the groups.
void linear_part(const at::Tensor& w, int64_t type, const float* x, int64_t M, int64_t K, Activations& a, float* y,
                 int part, int parts, double keep) {
  a.q.resize(M * K);
  a.d.resize(M * K / 32);
  a.qsum.resize(M * K / 32);
  modelplex_quant::quantize_activations16(x, M, K, a.q.data(), a.d.data(), a.qsum.data());
  modelplex_quant::group16_linear_part(type, w.data_ptr<uint8_t>(), w.size(0), K, a.q.data(), a.d.data(),
                                       a.qsum.data(), M, y, part, parts, keep);
}

// Shared int16 activations [M][K] (d and qsum [M][K / 32]), each thread writing its own blocks.
struct SharedActivations {
  int16_t* q;
  float* d;
  int32_t* qsum;
};

// The MLP's gate/up product (gate's rows then up's, [2 inter, K]; inter a multiple of 32) for this thread's
// pairs of groups of gate and the same of up, then silu(gate) * up on its columns into act [M, inter] and
// their int16 blocks into out: the values silu_and_mul_f32 and quantize_activations16 give on whole rows.
void gate_up_silu(const at::Tensor& w, int64_t type, const float* x, int64_t M, int64_t K, Activations& a, float* h,
                  float* act, SharedActivations out, int part, int parts, double keep) {
  const int64_t inter = w.size(0) / 2, groups = inter / 16, pairs = groups / 2, nb = inter / 32;
  const int64_t chunk = (pairs + parts - 1) / parts, p0 = std::min(pairs, part * chunk);
  const int64_t g0 = 2 * p0, g1 = 2 * std::min(pairs, p0 + chunk);
  a.q.resize(M * K);
  a.d.resize(M * K / 32);
  a.qsum.resize(M * K / 32);
  modelplex_quant::quantize_activations16(x, M, K, a.q.data(), a.d.data(), a.qsum.data());
  for (const int64_t first : {g0, groups + g0}) {
    modelplex_quant::group16_linear_groups(type, w.data_ptr<uint8_t>(), 2 * inter, K, a.q.data(), a.d.data(),
                                           a.qsum.data(), M, h, first, first + g1 - g0, keep);
  }
  const int64_t c0 = 16 * g0, width = 16 * (g1 - g0);
  if (width == 0) return;
  modelplex_swiglu::silu_and_mul_rows_f32(h + c0, h + inter + c0, 2 * inter, act + c0, inter, 0, M, width);
  for (int64_t t = 0; t < M; ++t) {
    modelplex_quant::quantize_activations16(act + t * inter + c0, 1, width, out.q + t * inter + c0,
                                            out.d + t * nb + c0 / 32, out.qsum + t * nb + c0 / 32);
  }
}

// Bytes of weights a step keeps in the L3 cache from one step to the next: half of this CPU's L3 (the rest
// holds the K/V cache, activations, code, other processes); 0 (everything streamed) where Linux does not say.
// Not sysconf(_SC_LEVEL3_CACHE_SIZE): in this VM it gives the host's 384 MB, sysfs the core's 32 MB.
int64_t kept_bytes() {
  static const int64_t bytes = [] {
    int64_t size = 0;
    char unit = 0;
    if (FILE* f = std::fopen("/sys/devices/system/cpu/cpu0/cache/index3/size", "r")) {
      if (std::fscanf(f, "%" SCNd64 "%c", &size, &unit) < 1) size = 0;
      std::fclose(f);
    }
    if (unit == 'K') size <<= 10;
    else if (unit == 'M') size <<= 20;
    return size / 2;
  }();
  return bytes;
}

using DecodeLayerFn = at::Tensor(at::Tensor, at::Tensor, const at::Tensor&, const at::Tensor&, double,
                                 const at::Tensor&, int64_t, const at::Tensor&, int64_t, const at::Tensor&, int64_t,
                                 const at::Tensor&, int64_t, const at::Tensor&, const at::Tensor&, at::Tensor,
                                 at::Tensor, const at::Tensor&, const at::Tensor&, const at::Tensor&, int64_t,
                                 int64_t, double);

// x [T, hidden]: the embeddings. Per layer i: norms, weights (types[4 i .. 4 i + 3]: q/k/v, o, gate/up,
// down) and cache views. -> the last layer's output plus the residual stream (the model's hidden states).
at::Tensor quant_decode_layers(const at::Tensor& x, at::TensorList input_norms, at::TensorList post_norms, double eps,
                               at::TensorList qkv, at::TensorList o, at::TensorList gate_up, at::TensorList down,
                               at::IntArrayRef types, const at::Tensor& cos, const at::Tensor& sin,
                               at::TensorList k_caches, at::TensorList v_caches, const at::Tensor& slot_mapping,
                               const at::Tensor& block_tables, const at::Tensor& context_lens, int64_t num_heads,
                               int64_t num_kv_heads, double scale) {
  const int64_t L = qkv.size();
  TORCH_CHECK(input_norms.size() == L && post_norms.size() == L && o.size() == L && gate_up.size() == L &&
                  down.size() == L && k_caches.size() == L && v_caches.size() == L &&
                  static_cast<int64_t>(types.size()) == 4 * L,
              "quant_decode_layers: one of each per layer");
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.dim() == 2 && x.is_contiguous(), "x: expected fp32 [tokens, hidden]");
  const int64_t M = x.size(0), H = x.size(1);
  bool grouped = true;
  for (int64_t t : types) {
    grouped = grouped && modelplex_quant::is_group16(t) && !modelplex_quant_gemm::prefers_quant_gemm(t, M);
  }
  auto layer_by_layer = [&] {  // one op call a layer (each checks its inputs)
    static const auto layer = op<DecodeLayerFn>("modelplex_cpu::quant_decode_layer");
    at::Tensor h = at::zeros_like(x), residual = x.clone();
    for (int64_t i = 0; i < L; ++i) {
      h = layer.call(h, residual, input_norms[i], post_norms[i], eps, qkv[i], types[4 * i], o[i], types[4 * i + 1],
                     gate_up[i], types[4 * i + 2], down[i], types[4 * i + 3], cos, sin, k_caches[i], v_caches[i],
                     slot_mapping, block_tables, context_lens, num_heads, num_kv_heads, scale);
    }
    return h + residual;
  };
  if (!grouped || L == 0 || num_kv_heads <= 0 || num_heads % num_kv_heads != 0) return layer_by_layer();
  for (int64_t i = 0; i < L; ++i) {
    for (const at::Tensor* w : {&qkv[i], &o[i], &gate_up[i], &down[i]}) {
      TORCH_CHECK(w->scalar_type() == at::kByte && w->dim() == 2 && w->is_contiguous(), "weights: expected uint8 rows");
    }
    TORCH_CHECK(o[i].size(0) == H && down[i].size(0) == H && gate_up[i].size(0) % 2 == 0 &&
                    qkv[i].size(0) == qkv[0].size(0) && gate_up[i].size(0) == gate_up[0].size(0),
                "quant_decode_layers: weight shapes differ between layers");
  }
  const int64_t n_qkv = qkv[0].size(0), inter = gate_up[0].size(0) / 2;
  const int64_t head_dim = n_qkv / (num_heads + 2 * num_kv_heads), q_size = num_heads * head_dim;
  const modelplex_dense::DecodeStep step{eps, {}, cos, sin, slot_mapping, block_tables, context_lens, num_heads,
                                         num_kv_heads, scale};
  // The norms, rotary and K/V store run directly on the rows (no dispatcher): where the tensors are not what
  // those read, the ops' own checks report it.
  bool direct = n_qkv % (num_heads + 2 * num_kv_heads) == 0 &&
                modelplex_decode::attention_applies(k_caches, v_caches, step, at::kFloat, M, head_dim);
  for (int64_t i = 0; i < L; ++i) {
    for (const at::Tensor* n : {&input_norms[i], &post_norms[i]}) {
      direct = direct && n->scalar_type() == at::kFloat && n->dim() == 1 && n->is_contiguous() && n->size(0) == H;
    }
  }
  if (!direct) return layer_by_layer();
  // Shared products; private per thread: the residual stream, the normed input, the activations.
  at::Tensor q_k_v = at::empty({M, n_qkv}, x.options()), o_out = at::empty({M, H}, x.options());
  at::Tensor h = at::empty({M, 2 * inter}, x.options()), y = at::zeros({M, H}, x.options());
  at::Tensor attn = at::empty({M, q_size}, x.options());
  // Each thread takes the same groups of gate and of up (pairs of groups: 32 columns, an activation block; the
  // down projection's inner size is whole blocks) and computes silu(gate) * up and its int16 blocks for its own
  // columns, into shared ones the down projection reads after the barrier, rather than each thread computing
  // all of them itself, as for the other products' inputs (at one sequence within noise of it, paired on the
  // 1B Q4_0 file; the work each thread no longer repeats grows with the batch: 8192 exps a row there).
  TORCH_CHECK(inter % 32 == 0, "quant_decode_layers: the MLP's size is not whole blocks of 32");
  at::Tensor act = at::empty({M, inter}, x.options());
  std::vector<int16_t> act_q(M * inter);
  std::vector<float> act_d(M * inter / 32);
  std::vector<int32_t> act_qsum(M * inter / 32);
  int parts = modelplex_team::team_size();
  std::vector<at::Tensor> residuals(parts), normed(parts);
  for (int p = 0; p < parts; ++p) {
    residuals[p] = x.clone();
    normed[p] = at::empty_like(x);
  }
  // A step streams more bytes than the L3 cache holds: each product's first `keep` is read as usual and stays
  // there for the next step; the rest is streamed (non-temporal prefetches), so it does not evict them.
  int64_t weight_bytes = 0;
  for (int64_t i = 0; i < L; ++i) weight_bytes += qkv[i].numel() + o[i].numel() + gate_up[i].numel() + down[i].numel();
  const double keep = std::min(1., static_cast<double>(kept_bytes()) / static_cast<double>(weight_bytes));
  modelplex_quant::set_group16_streaming(keep < 1.);
  SpinBarrier barrier(parts);
  modelplex_team::FirstError error;
  auto guarded = [&](auto&& body) { error.guard(body); };
  const bool inference = c10::InferenceMode::is_enabled();  // thread-local: the team's threads take the caller's
  auto run = [&](int part) {
    c10::InferenceMode mode(inference);
    float* residual = residuals[part].data_ptr<float>();
    float* xn_ptr = normed[part].data_ptr<float>();
    Activations a;
    std::vector<float> scratch(3 * head_dim);
    std::optional<modelplex_decode::AttentionPart> attention;
    guarded([&] { attention = modelplex_decode::attention_part(q_k_v, attn, step, part, parts); });
    // residual += x, then x = RMSNorm(residual), on the thread's own copy of every row
    auto add_norm = [&](const at::Tensor& norm) {
      for (int64_t t = 0; t < M; ++t) {
        modelplex_rows::add_rms_norm_row(xn_ptr + t * H, residual + t * H, norm.data_ptr<float>(), H, eps, nullptr);
      }
    };
    for (int64_t i = 0; i < L; ++i) {
      guarded([&] {
        std::memcpy(xn_ptr, y.data_ptr<float>(), M * H * sizeof(float));  // the first layer adds zeros
        add_norm(input_norms[i]);
        linear_part(qkv[i], types[4 * i], xn_ptr, M, H, a, q_k_v.data_ptr<float>(), part, parts, keep);
      });
      barrier.wait();
      guarded([&] {
        if (attention) modelplex_decode::attend(*attention, k_caches[i], v_caches[i], scale, scratch.data());
      });
      barrier.wait();
      guarded([&] { linear_part(o[i], types[4 * i + 1], attn.data_ptr<float>(), M, q_size, a, o_out.data_ptr<float>(),
                                part, parts, keep); });
      barrier.wait();
      guarded([&] {
        std::memcpy(xn_ptr, o_out.data_ptr<float>(), M * H * sizeof(float));
        add_norm(post_norms[i]);
        gate_up_silu(gate_up[i], types[4 * i + 2], xn_ptr, M, H, a, h.data_ptr<float>(), act.data_ptr<float>(),
                     {act_q.data(), act_d.data(), act_qsum.data()}, part, parts, keep);
      });
      barrier.wait();
      guarded([&] {
        modelplex_quant::group16_linear_part(types[4 * i + 3], down[i].data_ptr<uint8_t>(), H, inter, act_q.data(),
                                             act_d.data(), act_qsum.data(), M, y.data_ptr<float>(), part, parts, keep);
      });
      barrier.wait();
    }
  };
  modelplex_team::run_team(parts, barrier, run);
  error.rethrow();
  region_steps.fetch_add(1, std::memory_order_relaxed);
  return y + residuals[0];
}

int64_t quant_region_steps() { return region_steps.load(); }

}  // namespace

TORCH_LIBRARY_FRAGMENT(modelplex_cpu, m) {
  m.def("quant_decode_layers(Tensor x, Tensor[] input_norms, Tensor[] post_norms, float eps, Tensor[] qkv, "
        "Tensor[] o, Tensor[] gate_up, Tensor[] down, int[] types, Tensor cos, Tensor sin, Tensor(a!)[] k_caches, "
        "Tensor(b!)[] v_caches, Tensor slot_mapping, Tensor block_tables, Tensor context_lens, int num_heads, "
        "int num_kv_heads, float scale) -> Tensor");
  m.def("quant_region_steps() -> int", &quant_region_steps);  // no tensor to dispatch on: one kernel for all
}

TORCH_LIBRARY_IMPL(modelplex_cpu, CPU, m) {
  m.impl("quant_decode_layers", &quant_decode_layers);
}
