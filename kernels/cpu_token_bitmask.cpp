// Token bitmask applied to float32 logits, in place: bit j of bitmask[r, w] allows token 32 w + j of row
// indices[i] = r; a disallowed token's logit becomes -inf, and so does every token past the bitmask's 32 W
// (a logits width wider than the grammar's vocabulary). Rows not in indices are untouched. Torch
// reference: token_bitmask.apply_token_bitmask_torch (which unpacks the bits into a [R, V] bool tensor);
// this reads each word once, 16 logits a vector. Body: cpu_token_bitmask_body.h.
//
// logits [B, V] float32 (rows contiguous), bitmask [B, W] int32, indices [R] int64.
#include "cpu_isa.h"

#define RADIXLM_BODY "cpu_token_bitmask_body.h"
#include "cpu_foreach_isa.h"

namespace radixlm_cpu {
namespace {

void apply_token_bitmask(at::Tensor& logits, const at::Tensor& bitmask, const at::Tensor& indices, int64_t isa) {
  check_isa(isa);
  TORCH_CHECK(logits.dim() == 2 && logits.scalar_type() == at::kFloat && logits.stride(1) == 1,
              "logits must be a float32 [B, V] tensor with contiguous rows");
  TORCH_CHECK(bitmask.dim() == 2 && bitmask.scalar_type() == at::kInt && bitmask.is_contiguous() &&
                  bitmask.size(0) == logits.size(0),
              "bitmask must be a contiguous int32 [B, W] tensor with one row per logits row");
  TORCH_CHECK(indices.dim() == 1 && indices.scalar_type() == at::kLong, "indices must be an int64 vector");
  const at::Tensor rows = indices.contiguous();
  const int64_t* r = rows.data_ptr<int64_t>();
  const int64_t b = logits.size(0), vocab = logits.size(1), width = bitmask.size(1) * 32;
  for (int64_t i = 0; i < rows.numel(); ++i) {
    TORCH_CHECK(r[i] >= 0 && r[i] < b, "row index ", r[i], " out of range for ", b, " rows");
  }
  float* base = logits.data_ptr<float>();
  const int32_t* words = bitmask.data_ptr<int32_t>();
  at::parallel_for(0, rows.numel(), 1, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      RADIXLM_ISA_CALL(isa, mask_row, base + r[i] * logits.stride(0), words + r[i] * bitmask.size(1), vocab, width);
    }
  });
}

}  // namespace
}  // namespace radixlm_cpu

TORCH_LIBRARY_FRAGMENT(radixlm_cpu, m) {
  m.def("apply_token_bitmask(Tensor(a!) logits, Tensor bitmask, Tensor indices, int isa) -> ()");
}

TORCH_LIBRARY_IMPL(radixlm_cpu, CPU, m) { m.impl("apply_token_bitmask", &radixlm_cpu::apply_token_bitmask); }
