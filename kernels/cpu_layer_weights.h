// The fused decoder layers' weights (cpu_decoder_layer.cpp): each layer's four matrices and norms as views of the
// op's list of tensors, and the checks of what the object is given once (weights, pools, rotary tables, the LM
// head) and of what each call brings.
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <vector>

#include "cpu_ops.h"

namespace radixlm_cpu {

constexpr int kWeights = 21;  // tensors a layer in the op's list

// A layer's matrix: a weight, and its last rows in another width where it has them.
struct Matrix {
  QuantWeightRef w;
  std::optional<QuantWeightRef> tail;
  int64_t n() const { return w.n() + (tail ? tail->n() : 0); }
  int64_t k() const { return w.k(); }
  int64_t bits() const { return w.bits; }  // the activations' preparation (the tail's is the same)
};

// One layer's weights (views of the op's list, 21 per layer).
struct LayerWeights {
  const at::Tensor &norm1, &bias, &norm2;
  Matrix qkv, o, gate_up, down;
};

// A matrix's bits from its data: uint8 int4 codes (32 bytes a k-quad, or 288 a group in the K-quant layout), int5
// codes (40, or 352), the sub-blocks of int6, int3 or int2 (sub_block_bytes), int8 codes, else dense.
int64_t weight_bits(const at::Tensor& data);
// Layer `layer`'s weights, views of w (kWeights a layer)
LayerWeights layer_weights(const std::vector<at::Tensor>& w, int64_t layer);
// hidden and dtype: the model's (its pools' dtype is the activations'); dense: every matrix dense, else none
void check_layer_weights(const LayerWeights& lw, int64_t hidden, at::ScalarType dtype, int64_t num_heads, int64_t hkv,
                         int64_t d, bool dense);
// The LM head's weight from its (data, scales, mins) in one of the quantized layouts, against hidden size h.
QuantWeightRef lm_head(const std::vector<at::Tensor>& t, int64_t h);
// The pools [Hkv, S, D] and the rotary tables [P, D / 2], once, by the constructor.
void check_pools(const at::Tensor& k_cache, const at::Tensor& v_cache, const at::Tensor& cos, const at::Tensor& sin,
                 int64_t num_heads);
// One call's x [T, H], positions [T] (rows of the tables) and slots loc [T] against the pools.
void check_call(const at::Tensor& x, const at::Tensor& pos, const at::Tensor& loc, const at::Tensor& k_cache,
                int64_t table_rows);

// The requests of a call: table [rows, L] int64 with contiguous rows (the slot table), req_rows [R] rows of it,
// seq_lens [R] in [1, L], ext_lens [R] or empty (decode: one token a request, R = t).
void check_requests(const at::Tensor& table, const at::Tensor& req_rows, const at::Tensor& seq_lens,
                    const at::Tensor& ext_lens, int64_t t);

}  // namespace radixlm_cpu
