// radixlm's C++ CPU ops as C++ functions, for the ops built from them (the fused decoder layer): the whole
// ops, and the parts of them one thread runs over a range (rows, weight tiles, attention tasks) inside a
// parallel region of the caller's. Each op is registered as torch.ops.radixlm_cpu.<name> by its own file;
// isa is the kernel path (cpu_isa.h). The range functions check nothing: the caller has.
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "cpu_types.h"

namespace radixlm_cpu {

// A weight for the matmuls: int4 (bits 4: codes, d, mn; mn may be empty; or IQ4 codes, d and in mn their values or
// nothing; or the table form's codes, d and values), int5 (bits 5: codes, d, mn), int6 (bits 6: codes with their
// sub-block scales, d per 256), int3 (bits 3: likewise), int2 (bits 2: likewise, and -dmin), int8 (bits 8: q, d per
// group of 32) or dense (bits 16: the [N / 16, K, 16] tiles in x's dtype). cpu_matmul.cpp has the layouts.
struct QuantWeightRef {
  int64_t bits;
  at::Tensor data, scales, mins;
  int64_t n() const;  // output rows
  int64_t k() const;  // input columns
  int64_t nbytes() const {  // what a pass over it reads
    return data.nbytes() + scales.nbytes() + (mins.defined() ? mins.nbytes() : 0);
  }
  bool iq4() const {  // int4 codes indexing 16 values: [N / 16, K / 32, 256] with d per 32, or IQ4_XS's
    return bits == 4 && data.dim() == 3 && (data.size(2) == 256 || iq4_xs());
  }
  bool iq4_xs() const {  // [N / 16, K / 32, 272]: each group's codes then 16 int8 scales, d per 256
    return bits == 4 && data.dim() == 3 && data.size(2) == 272;
  }
  bool table() const {  // int4 codes into 16 values (mins) with scales per 16: [N / 16, K / 16, 144], d per 256
    return bits == 4 && data.dim() == 3 && data.size(2) == sub_block_bytes(4);
  }
  bool kform() const {  // int4 / int5 codes in the K-quant layout (each group's scales inline, d and -dmin per 256)
    return (bits == 4 || bits == 5) && data.dim() == 3 && data.size(2) == (bits == 4 ? 288 : 352);
  }
};

// The part [b, e) of count items that thread `tid` of `nt` takes: equal shares in thread order, b and e
// multiples of `unit` (except e = count at the end).
inline std::pair<int64_t, int64_t> thread_part(int64_t count, int tid, int nt, int64_t unit = 1) {
  const int64_t per = ((count + nt - 1) / nt + unit - 1) / unit * unit, b = std::min(count, tid * per);
  return {b, std::min(count, b + per)};
}

// Thread tid's tasks of [0, shared.first), which it runs alone: its balanced range, or an even count of
// tasks if the parallel region has another number of threads than the plan.
inline std::pair<int64_t, int64_t> own_tasks(const SharedAttention& shared, int tid, int nt) {
  if (static_cast<int64_t>(shared.bounds.size()) != nt + 1) return thread_part(shared.first, tid, nt);
  return {shared.bounds[tid], shared.bounds[tid + 1]};
}

// Thread `tid`'s cells of a row-wise phase whose rows split into independent units (64-column blocks, heads):
// rows [r0, r1) x units [u0, u1). Whole rows when there is a row for every thread, else its part of every
// row's units, so that no thread idles at batch 1. Each unit is computed alone, so the split never changes bits.
struct CellPart {
  int64_t r0, r1, u0, u1;
  bool empty() const { return r0 >= r1 || u0 >= u1; }
};

inline CellPart cell_part(int64_t rows, int64_t units, int tid, int nt) {
  if (rows >= nt) {
    auto [r0, r1] = thread_part(rows, tid, nt);
    return {r0, r1, 0, units};
  }
  auto [u0, u1] = thread_part(units, tid, nt);
  return {0, rows, u0, u1};
}

void check_weight(const QuantWeightRef& w);  // a TORCH_CHECK naming what is wrong
at::Tensor int4_linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& d, const at::Tensor& mn, int64_t isa);
at::Tensor int5_linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& d, const at::Tensor& mn, int64_t isa);
at::Tensor int6_linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& d, int64_t isa);
at::Tensor int3_linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& d, int64_t isa);
at::Tensor int2_linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& d, const at::Tensor& mn, int64_t isa);
at::Tensor int8_linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& d, int64_t isa);
at::Tensor dense_linear(const at::Tensor& x, const at::Tensor& w, int64_t isa);
at::Tensor int8_rows(const at::Tensor& w, const at::Tensor& d, const at::Tensor& ids, at::ScalarType dtype);
// The logits of x [M, K] (float32 or bfloat16) against a checked weight -> float32 [M, N]: a quantized weight's
// float32 sums as they are (the matmul ops of x.float() give these bits), a dense one's rounded in its dtype as
// dense_linear gives them, then widened.
at::Tensor linear_logits(const at::Tensor& x, const QuantWeightRef& w, int64_t isa);
// A TORCH_CHECK that logits are float32 [R, N] with contiguous rows and cols (the vocabulary's) within 1-N.
void check_logits(const at::Tensor& logits, int64_t cols);
// Each row's first index of its maximum among the first `cols` logits of float32 [R, N] -> int64 [R]; a NaN counts as
// the maximum, as torch's argmax has it (greedy decoding inside the fused layers' call).
at::Tensor argmax_rows(const at::Tensor& logits, int64_t cols);
// Each row's draw among the first `cols` logits of float32 [R, N] with its temperature (0: the argmax), top_k, top_p,
// min_p and uniform u in [0, 1), one value a row each -> int64 [R] (cpu_sample.cpp has the semantics)
at::Tensor sample_rows(const at::Tensor& logits, int64_t cols, at::ArrayRef<double> temperature,
                       at::ArrayRef<int64_t> top_k, at::ArrayRef<double> top_p, at::ArrayRef<double> min_p,
                       at::ArrayRef<double> u, int64_t isa);
// One row's logit bias and penalties, applied as sampling.penalize_torch does, bit for bit (float32,
// each scalar rounded to float32 first): bias added, the repetition penalty over the tokens seen (prompt and
// output; a positive logit divided by it, the others multiplied), then frequency * count + presence subtracted
// for each output token. cpu_penalties.cpp.
struct RowPenalty {
  float repetition = 1.f, frequency = 0.f, presence = 0.f;
  std::vector<std::pair<int64_t, float>> bias;
  std::unordered_set<int64_t> seen;
  std::unordered_map<int64_t, int64_t> counts;  // output token -> times
  void apply(float* logits) const;              // one row, in place
  void add(int64_t token);                       // a new output token
};
// The rows' penalties from their packed form (kernels/sampling.py, RowPenalties.packed): settings [3R] (repetition,
// frequency, presence a row) and tokens: seen ids [S] with offsets [R + 1], output ids [O] with offsets [R + 1],
// bias ids [N], values [N] float32 and offsets [R + 1]; every id checked against vocab.
std::vector<RowPenalty> row_penalties(at::ArrayRef<double> settings, const std::vector<at::Tensor>& tokens,
                                      int64_t rows, int64_t vocab);
// x's cells (rows x 64-column blocks) prepared for a weight of `bits` (quantized, or widened to float32),
// then weight tiles [t0, t1) of y = x W^T from them, into y's columns from col0 (a multiple of 16: W may be
// the last rows of a stacked weight whose parts differ in width)
void prepare_range(const at::Tensor& x, const CellPart& p, const Activations& a, int64_t bits, int64_t isa);
void linear_tiles(const QuantWeightRef& w, const Activations& a, int64_t t0, int64_t t1, at::Tensor& y, int64_t col0,
                  int64_t isa);

at::Tensor decode_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& idx,
                            const at::Tensor& counts, const at::Tensor& prefix, const at::Tensor& member, int64_t isa);
at::Tensor extend_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& table,
                            const at::Tensor& seq_lens, const at::Tensor& ext_lens, int64_t isa);
// The attention tasks of a decode or an extend step; request r's slots are row row_ids[r] of idx / table, or row r
// where row_ids is undefined (the caller has checked the rows and lengths against the table)
std::vector<AttentionTask> decode_tasks(const at::Tensor& q, const at::Tensor& k, const at::Tensor& idx,
                                        const at::Tensor& counts, const at::Tensor& prefix, const at::Tensor& member,
                                        const at::Tensor& row_ids = at::Tensor());
std::vector<AttentionTask> extend_tasks(const at::Tensor& q, const at::Tensor& k, const at::Tensor& table,
                                        const at::Tensor& seq_lens, const at::Tensor& ext_lens,
                                        const at::Tensor& row_ids = at::Tensor());
void run_attention(const std::vector<AttentionTask>& tasks, const at::Tensor& q, const at::Tensor& k,
                   const at::Tensor& v, at::Tensor& out, int64_t i0, int64_t i1, Scratch& scratch, int64_t isa);
// nt + 1 bounds that cut tasks [0, count) into contiguous ranges of about equal work (query rows x the keys
// they see): an extend's causal tasks see more keys chunk by chunk, and lengths differ between requests.
std::vector<int64_t> balanced_bounds(const std::vector<AttentionTask>& tasks, int64_t count, int64_t nt);
// Which tasks nt threads run together (the last tasks.size() % nt; none on the AVX512-BF16 path, whose
// attention is not staged), with their buffers.
SharedAttention plan_shared_attention(const std::vector<AttentionTask>& tasks, int64_t nt, int64_t isa);
// Thread tid's part of the shared tasks, inside the caller's parallel region of nt threads: keys, then rows,
// then value chunks, with a barrier after each of the first two stages (every thread must call it). The
// result has the bits of one thread running each task whole.
void run_shared_attention(const std::vector<AttentionTask>& tasks, const at::Tensor& q, const at::Tensor& k,
                          const at::Tensor& v, at::Tensor& out, SharedAttention& shared, int tid, int nt,
                          Scratch& scratch, int64_t isa);

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& w, double eps, int64_t isa);
at::Tensor add_rms_norm_(const at::Tensor& x, at::Tensor& residual, const at::Tensor& w, double eps, int64_t isa);
at::Tensor silu_mul(const at::Tensor& gate_up, int64_t isa);
// rows [r0, r1): residual += x, out = rms_norm(residual) * w (residual in w's dtype or float32; may be null: out =
// rms_norm(x) * w); x and out each in w's dtype or float32
void rms_norm_range(const at::Tensor& x, at::Tensor* residual, const at::Tensor& w, double eps, int64_t r0, int64_t r1,
                    at::Tensor& out, int64_t isa);
// rows [r0, r1), output columns [j0, j1) (multiples of 16) of silu(gate) * up
void silu_mul_range(const at::Tensor& gate_up, int64_t r0, int64_t r1, int64_t j0, int64_t j1, at::Tensor& out,
                    int64_t isa);

// Tokens [p.r0, p.r1), heads [p.u0, p.u1) of the Hq query then Hkv KV heads of qkv [T, Hq + 2 Hkv, D] + bias
// (empty: none): q rotated into q [T, Hq, D]; k rotated and v stored into the pools [Hkv, S, D] at slots loc [T].
// cpu_rope_store.cpp.
void rope_store_range(const at::Tensor& qkv, const at::Tensor& bias, const at::Tensor& cos, const at::Tensor& sin,
                      const at::Tensor& pos, at::Tensor& k_cache, at::Tensor& v_cache, const at::Tensor& loc,
                      const CellPart& p, at::Tensor& q, int64_t isa);
// Thread tid's cells of RoPE + KV store for t rows of hq query and hkv KV heads.
CellPart rope_part(int64_t t, int64_t hq, int64_t hkv, int tid, int nt);

}  // namespace radixlm_cpu
