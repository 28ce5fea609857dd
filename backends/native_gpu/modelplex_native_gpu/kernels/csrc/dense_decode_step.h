// dense_decode_step.cpp's entry point for dense_layer.cpp's dense_layers.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

namespace modelplex_dense {

// Per layer: norms, packed weights, the K/V cache views (dense_layers' lists).
struct Layers {
  at::TensorList input_norms, post_norms, qkv, o, gate_up, down, k_caches, v_caches;
};

// A decode-only step's layout: every row a sequence's one token.
struct DecodeStep {
  double eps;
  c10::ArrayRef<int64_t> out_features;  // qkv, o, gate_up, down
  const at::Tensor &cos, &sin, &slot_mapping, &block_tables, &context_lens;
  int64_t num_heads, num_kv_heads;
  double scale;
};

// Every layer of a decode-only step in one parallel region, then x + residual: bit for bit dense_layers' op by op
// path. Undefined where it does not apply (not the fp32 or bf16 panels of csrc/linear*.cpp at the shapes they
// take, or gate's and up's columns not whole panels): the caller then runs the op by op path, which reports what
// is wrong where something is.
at::Tensor decode_step(const at::Tensor& x, const Layers& w, const DecodeStep& s);

}  // namespace modelplex_dense
