// The fused decoder layers' weights and input checks (declared, with what each does, in cpu_layer_weights.h).
#include "cpu_layer_weights.h"

namespace radixlm_cpu {

void check_pools(const at::Tensor& k_cache, const at::Tensor& v_cache, const at::Tensor& cos, const at::Tensor& sin,
                 int64_t num_heads) {
  const int64_t d = k_cache.size(2);
  TORCH_CHECK(k_cache.dim() == 3 && v_cache.sizes() == k_cache.sizes() && k_cache.is_contiguous() &&
              v_cache.is_contiguous() && v_cache.scalar_type() == k_cache.scalar_type(),
              "k_cache and v_cache must be contiguous [Hkv, S, D] pools of one dtype");
  TORCH_CHECK(k_cache.scalar_type() == at::kFloat || k_cache.scalar_type() == at::kBFloat16,
              "the pools must be float32 or bfloat16");
  TORCH_CHECK(d == 64 || d == 128, "head dim must be 64 or 128, got ", d);
  TORCH_CHECK(num_heads % k_cache.size(0) == 0 && num_heads / k_cache.size(0) <= 16,
              "query heads must be 1-16 per KV head");
  TORCH_CHECK(cos.sizes() == sin.sizes() && cos.dim() == 2 && cos.size(1) == d / 2 && cos.scalar_type() == at::kFloat &&
              sin.scalar_type() == at::kFloat && cos.is_contiguous() && sin.is_contiguous(),
              "cos and sin must be contiguous float32 [P, D / 2] rotary tables");
}

void check_call(const at::Tensor& x, const at::Tensor& pos, const at::Tensor& loc, const at::Tensor& k_cache,
                int64_t table_rows) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && x.size(1) % 64 == 0 && x.scalar_type() == k_cache.scalar_type(),
              "x must be a contiguous [T, H] tensor in the pools' dtype, H a multiple of 64");
  const int64_t t = x.size(0);
  TORCH_CHECK(loc.numel() == t && loc.scalar_type() == at::kLong && loc.is_contiguous(), "loc must be int64 [T]");
  TORCH_CHECK(pos.numel() == t && pos.scalar_type() == at::kLong && pos.is_contiguous(), "positions must be int64 [T]");
  const int64_t* p = pos.data_ptr<int64_t>();
  for (int64_t i = 0; i < t; ++i) {
    TORCH_CHECK(p[i] >= 0 && p[i] < table_rows, "position ", p[i], " is outside the rotary tables' ", table_rows,
                " rows");
  }
}

int64_t weight_bits(const at::Tensor& data) {
  if (data.scalar_type() == at::kByte) {
    const int64_t last = data.dim() == 3 ? data.size(2) : 0;
    for (int64_t bits : {2, 3, 6}) {
      if (last == sub_block_bytes(bits)) return bits;
    }
    return last == 40 || last == 352 ? 5 : 4;  // 352: int5 in the K-quant layout
  }
  return data.scalar_type() == at::kChar ? 8 : 16;
}

LayerWeights layer_weights(const std::vector<at::Tensor>& w, int64_t layer) {
  const at::Tensor* l = w.data() + layer * kWeights;
  auto ref = [&](int i) { return QuantWeightRef{weight_bits(l[i]), l[i], l[i + 1], l[i + 2]}; };
  auto stacked = [&](int i) {  // a weight and its tail
    return l[i + 3].numel() > 0 ? Matrix{ref(i), ref(i + 3)} : Matrix{ref(i), std::nullopt};
  };
  return {l[0], l[7], l[11], stacked(1), Matrix{ref(8), std::nullopt}, stacked(12), Matrix{ref(18), std::nullopt}};
}

void check_layer_weights(const LayerWeights& lw, int64_t hidden, at::ScalarType dtype, int64_t num_heads, int64_t hkv,
                         int64_t d, bool dense) {
  for (const Matrix* m : {&lw.qkv, &lw.o, &lw.gate_up, &lw.down}) {
    for (const QuantWeightRef* wt : {&m->w, m->tail ? &*m->tail : nullptr}) {
      if (wt == nullptr) continue;
      check_weight(*wt);
      TORCH_CHECK((wt->bits == 16) == dense, "weights must be all quantized (int2 - int8) or all dense");
      TORCH_CHECK(wt->bits != 16 || wt->data.scalar_type() == dtype, "dense weights must be in the pools' dtype");
    }
    TORCH_CHECK(!m->tail || m->tail->k() == m->k(), "a matrix's tail must have the matrix's columns");
  }
  TORCH_CHECK(lw.norm1.sizes() == lw.norm2.sizes() && lw.norm1.numel() == hidden && lw.norm1.scalar_type() == dtype,
              "norm weights must be [H] in the pools' dtype");
  TORCH_CHECK(lw.qkv.k() == hidden && lw.qkv.n() == (num_heads + 2 * hkv) * d && lw.o.k() == num_heads * d &&
              lw.o.n() == hidden && lw.gate_up.k() == hidden && lw.down.n() == hidden &&
              lw.down.k() * 2 == lw.gate_up.n() && lw.down.k() % 64 == 0,
              "weights: shapes disagree with the model (or the intermediate size is not a multiple of 64)");
  TORCH_CHECK(lw.bias.numel() == 0 || (lw.bias.numel() == lw.qkv.n() && lw.bias.is_contiguous() &&
                                       lw.bias.scalar_type() == dtype),
              "the qkv bias must be empty or [(Hq + 2 Hkv) D] in the pools' dtype");
}

QuantWeightRef lm_head(const std::vector<at::Tensor>& t, int64_t h) {
  TORCH_CHECK(t.size() == 3, "head: expected its data, scales and minimums (3 tensors), got ", t.size());
  const QuantWeightRef w{weight_bits(t[0]), t[0], t[1], t[2]};
  TORCH_CHECK(w.bits != 16, "head: the LM head must be in one of the quantized layouts");
  check_weight(w);
  TORCH_CHECK(w.k() == h, "head: the LM head takes ", w.k(), " columns, the model's hidden size is ", h);
  return w;
}

void check_requests(const at::Tensor& table, const at::Tensor& req_rows, const at::Tensor& seq_lens,
                    const at::Tensor& ext_lens, int64_t t) {
  TORCH_CHECK(table.dim() == 2 && table.scalar_type() == at::kLong && table.stride(1) == 1,
              "table must be int64 [rows, L] with contiguous rows");
  const int64_t r = req_rows.numel();
  TORCH_CHECK(req_rows.dim() == 1 && req_rows.scalar_type() == at::kLong && req_rows.is_contiguous() &&
              seq_lens.dim() == 1 && seq_lens.numel() == r && seq_lens.scalar_type() == at::kLong &&
              seq_lens.is_contiguous(), "req_rows and seq_lens must be contiguous int64 [R]");
  TORCH_CHECK(ext_lens.numel() == 0 ? r == t : ext_lens.numel() == r && ext_lens.scalar_type() == at::kLong &&
              ext_lens.is_contiguous(), "ext_lens must be empty (decode: one token a request) or int64 [R]");
  const int64_t *rows = req_rows.data_ptr<int64_t>(), *seq = seq_lens.data_ptr<int64_t>();
  for (int64_t i = 0; i < r; ++i) {
    TORCH_CHECK(rows[i] >= 0 && rows[i] < table.size(0) && seq[i] >= 1 && seq[i] <= table.size(1), "request ", i,
                ": row ", rows[i], " or length ", seq[i], " outside the table's ", table.size(0), " x ",
                table.size(1));
  }
}

}  // namespace radixlm_cpu
