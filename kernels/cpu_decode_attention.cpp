// Decode and extend (prefill) attention straight from the paged KV pool: each request's keys and values
// are read through its slot list (no gather, no padding). Torch reference: cpu_decode_attention.py. The
// body is cpu_attention_body.h (every instruction set), with cpu_attention_bf16.h for bfloat16 pools on
// AVX512-BF16 CPUs.
//
// decode: q [B, Hq, D] (float32 or bfloat16); k, v one layer's pool [Hkv, S, D] in q's dtype, head-major;
// idx [B, Ls] int64 slots of each request's own part, the first counts[b] of them valid; prefix [P] int64
// slots of a shared prefix that the requests with member[b] != 0 attend to first (P may be 0).
// -> out [B, Hq * D]. D is 64 or 128; the G = Hq / Hkv query heads of a KV head share its reads.
// One task per (request, KV head): scores in float32, exact softmax (max, exp, sum) over the whole row.
// Loop order keeps a KV head's shared prefix hot in L2 across the requests of one thread.
#include "cpu_isa.h"
#include "cpu_ops.h"

#define RADIXLM_BODY "cpu_attention_body.h"
#include "cpu_foreach_isa.h"

#if defined(__x86_64__)
#pragma GCC push_options
#pragma GCC target("avx512f,avx512dq,avx512bw,avx512vl,avx512vnni,avx512bf16,avx2,fma,f16c")
namespace radixlm_avx512bf16 {
#include "cpu_vec_avx512.h"
#include "cpu_attention_body.h"
#include "cpu_attention_bf16.h"
}  // namespace radixlm_avx512bf16
#pragma GCC pop_options
#endif

namespace radixlm_cpu {
namespace {

// One task on the chosen path. DC = D / 16.
template <int DC, typename T>
void attend(int64_t isa, const T* q, const QueryRows& qr, const T* kh, const T* vh, const Rows& rows, float scale,
            Scratch& scratch, T* out) {
#if defined(__x86_64__)
  if constexpr (std::is_same_v<T, at::BFloat16>) {
    if (isa == kAvx512Bf16) return radixlm_avx512bf16::attend_rows_bf16<DC / 2>(q, qr, kh, vh, rows, scale, scratch, out, qr);
  }
#endif
  RADIXLM_ISA_CALL(isa, attend_rows<DC>, q, qr, kh, vh, rows, scale, scratch, out, qr);
}

template <int DC, typename T>
void run_typed(const std::vector<AttentionTask>& tasks, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
               at::Tensor& out, int64_t i0, int64_t i1, Scratch& scratch, int64_t isa) {
  const T* qd = q.data_ptr<T>();
  const T* kd = k.data_ptr<T>();
  const T* vd = v.data_ptr<T>();
  T* od = out.data_ptr<T>();
  const float scale = 1.f / std::sqrt(static_cast<float>(DC * 16));
  for (int64_t i = i0; i < i1; ++i) {
    const AttentionTask& t = tasks[i];
    const int64_t off = t.head * k.stride(0);
    attend<DC, T>(isa, qd + t.at, t.qr, kd + off, vd + off, t.rows, scale, scratch, od + t.at);
  }
}

void check_pool(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  TORCH_CHECK(q.dim() == 3 && q.is_contiguous(), "q must be a contiguous [T, Hq, D] tensor");
  TORCH_CHECK(k.dim() == 3 && k.stride(2) == 1 && k.stride(1) == q.size(2) && v.strides() == k.strides() &&
              v.sizes() == k.sizes(), "k and v must be head-major [Hkv, S, D] pools with contiguous rows");
  TORCH_CHECK(k.scalar_type() == q.scalar_type() && v.scalar_type() == q.scalar_type(), "q, k and v dtypes differ");
  TORCH_CHECK(q.scalar_type() == at::kFloat || q.scalar_type() == at::kBFloat16, "q must be float32 or bfloat16");
  TORCH_CHECK(q.size(2) == 64 || q.size(2) == 128, "head dim must be 64 or 128, got ", q.size(2));
  TORCH_CHECK(q.size(1) % k.size(0) == 0 && q.size(1) / k.size(0) <= 16, "query heads must be 1-16 per KV head");
}

at::Tensor run_all(const std::vector<AttentionTask>& tasks, const at::Tensor& q, const at::Tensor& k,
                   const at::Tensor& v, int64_t isa) {
  at::Tensor out = at::empty({q.size(0), q.size(1) * q.size(2)}, q.options());
  const int64_t nt = at::get_num_threads();
  const std::vector<int64_t> bounds = balanced_bounds(tasks, static_cast<int64_t>(tasks.size()), nt);
  at::parallel_for(0, nt, 1, [&](int64_t t0, int64_t t1) {
    Scratch scratch;
    for (int64_t t = t0; t < t1; ++t) {
      if (bounds[t] < bounds[t + 1]) run_attention(tasks, q, k, v, out, bounds[t], bounds[t + 1], scratch, isa);
    }
  });
  return out;
}

constexpr int64_t kChunk = 16;  // query tokens an extend task: long prompts split across threads

}  // namespace

// Decode: one task per (request, KV head), head-major so that a head's shared prefix stays in cache.
std::vector<AttentionTask> decode_tasks(const at::Tensor& q, const at::Tensor& k, const at::Tensor& idx,
                                        const at::Tensor& counts, const at::Tensor& prefix, const at::Tensor& member,
                                        const at::Tensor& row_ids) {
  const int64_t b_count = q.size(0), hq = q.size(1), hkv = k.size(0), stride = idx.stride(0), d = q.size(2);
  const int64_t g = hq / hkv;
  const int64_t* id = idx.data_ptr<int64_t>();
  const int64_t* rid = row_ids.defined() ? row_ids.data_ptr<int64_t>() : nullptr;
  const int64_t* cd = counts.data_ptr<int64_t>();
  const bool* md = member.defined() ? member.data_ptr<bool>() : nullptr;  // undefined: no shared prefix
  const int64_t* pd = md != nullptr ? prefix.data_ptr<int64_t>() : nullptr;
  std::vector<AttentionTask> tasks;
  tasks.reserve(hkv * b_count);
  for (int64_t h = 0; h < hkv; ++h) {
    for (int64_t b = 0; b < b_count; ++b) {
      const int64_t pre = md != nullptr && md[b] ? prefix.size(0) : 0;
      const int64_t* own = id + (rid != nullptr ? rid[b] : b) * stride;
      tasks.push_back({Rows{pd, pre, own, pre + cd[b]}, QueryRows{1, g, hq * d}, (b * hq + h * g) * d, h});
    }
  }
  return tasks;
}

// Extend: request r's ext[r] new tokens attend causally to its slots table[row r, :seq[r]] (its cached prefix,
// then the new tokens, already stored); tasks of kChunk tokens x one KV head.
std::vector<AttentionTask> extend_tasks(const at::Tensor& q, const at::Tensor& k, const at::Tensor& table,
                                        const at::Tensor& seq_lens, const at::Tensor& ext_lens,
                                        const at::Tensor& row_ids) {
  const int64_t hq = q.size(1), hkv = k.size(0), d = q.size(2), g = hq / hkv;
  const int64_t* seq = seq_lens.data_ptr<int64_t>();
  const int64_t* ext = ext_lens.data_ptr<int64_t>();
  const int64_t* rid = row_ids.defined() ? row_ids.data_ptr<int64_t>() : nullptr;
  std::vector<AttentionTask> tasks;
  int64_t q0 = 0;
  for (int64_t r = 0; r < seq_lens.numel(); ++r) {
    TORCH_CHECK(ext[r] >= 1 && ext[r] <= seq[r] && seq[r] <= table.size(1), "request ", r, ": bad lengths");
    const int64_t* slots = table.data_ptr<int64_t>() + (rid != nullptr ? rid[r] : r) * table.stride(0);
    for (int64_t c0 = 0; c0 < ext[r]; c0 += kChunk) {
      const int64_t c1 = std::min(ext[r], c0 + kChunk);
      for (int64_t h = 0; h < hkv; ++h) {
        tasks.push_back({Rows{nullptr, 0, slots, seq[r] - ext[r] + c1},
                         QueryRows{c1 - c0, g, hq * d}, (q0 + c0) * hq * d + h * g * d, h});
      }
    }
    q0 += ext[r];
  }
  TORCH_CHECK(q0 == q.size(0), "q has ", q.size(0), " rows; the requests extend by ", q0);
  return tasks;
}

void run_attention(const std::vector<AttentionTask>& tasks, const at::Tensor& q, const at::Tensor& k,
                   const at::Tensor& v, at::Tensor& out, int64_t i0, int64_t i1, Scratch& scratch, int64_t isa) {
  const bool bf16 = q.scalar_type() == at::kBFloat16;
  if (q.size(2) == 64) {
    bf16 ? run_typed<4, at::BFloat16>(tasks, q, k, v, out, i0, i1, scratch, isa)
         : run_typed<4, float>(tasks, q, k, v, out, i0, i1, scratch, isa);
  } else {
    bf16 ? run_typed<8, at::BFloat16>(tasks, q, k, v, out, i0, i1, scratch, isa)
         : run_typed<8, float>(tasks, q, k, v, out, i0, i1, scratch, isa);
  }
}

namespace {

template <int DC, typename T>
void run_shared_typed(const std::vector<AttentionTask>& tasks, const at::Tensor& q, const at::Tensor& k,
                      const at::Tensor& v, at::Tensor& out, SharedAttention& sh, int tid, int nt, Scratch& scratch,
                      int64_t isa) {
  const T* qd = q.data_ptr<T>();
  const T* kd = k.data_ptr<T>();
  const T* vd = v.data_ptr<T>();
  T* od = out.data_ptr<T>();
  const float scale = 1.f / std::sqrt(static_cast<float>(DC * 16));
  const int64_t count = static_cast<int64_t>(tasks.size());
  for (int64_t i = sh.first; i < count; ++i) {  // scores: keys in groups of 4
    const AttentionTask& t = tasks[i];
    auto [k0, k1] = thread_part(t.rows.len, tid, nt, 4);
    float* s = sh.scores.data() + sh.score_at[i - sh.first];
    if (k0 < k1) RADIXLM_ISA_CALL(isa, attend_scores<DC>, qd + t.at, t.qr, kd + t.head * k.stride(0), t.rows, scale, s, scratch.q, k0, k1);
  }
#pragma omp barrier
  for (int64_t i = sh.first; i < count; ++i) {  // softmax: rows
    const AttentionTask& t = tasks[i];
    auto [r0, r1] = thread_part(t.qr.n * t.qr.g, tid, nt);
    RADIXLM_ISA_CALL(isa, attend_softmax, t.qr, t.rows, sh.scores.data() + sh.score_at[i - sh.first],
                     sh.inv_sum.data() + sh.inv_at[i - sh.first], r0, r1);
  }
#pragma omp barrier
  const int64_t cb = RADIXLM_ISA_CALL(isa, value_chunks<DC>);
  for (int64_t i = sh.first; i < count; ++i) {  // values: blocks of cb 16-dim chunks
    const AttentionTask& t = tasks[i];
    auto [c0, c1] = thread_part(DC, tid, nt, cb);
    if (c0 < c1) {
      RADIXLM_ISA_CALL(isa, attend_values<DC>, t.qr, vd + t.head * v.stride(0), t.rows,
                       sh.scores.data() + sh.score_at[i - sh.first], sh.inv_sum.data() + sh.inv_at[i - sh.first],
                       od + t.at, t.qr, c0, c1);
    }
  }
}

}  // namespace

std::vector<int64_t> balanced_bounds(const std::vector<AttentionTask>& tasks, int64_t count, int64_t nt) {
  std::vector<int64_t> work(count + 1, 0);  // work[i]: tasks [0, i)'s, in row-keys (+ a task's fixed cost)
  for (int64_t i = 0; i < count; ++i) {
    const AttentionTask& t = tasks[i];
    work[i + 1] = work[i] + t.qr.n * t.qr.g * (t.rows.len - (t.qr.n - 1) / 2) + 64;
  }
  std::vector<int64_t> bounds(nt + 1, count);
  bounds[0] = 0;
  for (int64_t t = 1; t < nt; ++t) {  // the cut nearest to t / nt of the work, never before the last one
    const int64_t target = work[count] * t / nt;
    int64_t i = std::lower_bound(work.begin(), work.end(), target) - work.begin();
    if (i > 0 && target - work[i - 1] < work[i] - target) --i;
    bounds[t] = std::max(bounds[t - 1], i);
  }
  return bounds;
}

SharedAttention plan_shared_attention(const std::vector<AttentionTask>& tasks, int64_t nt, int64_t isa) {
  SharedAttention sh;
  const int64_t count = static_cast<int64_t>(tasks.size());
  sh.first = isa == kAvx512Bf16 || nt <= 1 ? count : count - count % nt;
  sh.bounds = balanced_bounds(tasks, sh.first, std::max<int64_t>(nt, 1));
  int64_t scores = 0, inv = 0;
  for (int64_t i = sh.first; i < count; ++i) {
    const int64_t r_count = tasks[i].qr.n * tasks[i].qr.g;
    sh.score_at.push_back(scores);
    sh.inv_at.push_back(inv);
    scores += r_count * radixlm_portable::score_stride(tasks[i].rows);  // the same in every path's namespace
    inv += r_count;
  }
  sh.scores.assign(scores, 0.f);
  sh.inv_sum.assign(inv, 0.f);
  return sh;
}

void run_shared_attention(const std::vector<AttentionTask>& tasks, const at::Tensor& q, const at::Tensor& k,
                          const at::Tensor& v, at::Tensor& out, SharedAttention& shared, int tid, int nt,
                          Scratch& scratch, int64_t isa) {
  if (shared.first == static_cast<int64_t>(tasks.size())) return;  // no barrier: every thread returns here
  const bool bf16 = q.scalar_type() == at::kBFloat16;
  if (q.size(2) == 64) {
    bf16 ? run_shared_typed<4, at::BFloat16>(tasks, q, k, v, out, shared, tid, nt, scratch, isa)
         : run_shared_typed<4, float>(tasks, q, k, v, out, shared, tid, nt, scratch, isa);
  } else {
    bf16 ? run_shared_typed<8, at::BFloat16>(tasks, q, k, v, out, shared, tid, nt, scratch, isa)
         : run_shared_typed<8, float>(tasks, q, k, v, out, shared, tid, nt, scratch, isa);
  }
}

at::Tensor decode_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& idx,
                            const at::Tensor& counts, const at::Tensor& prefix, const at::Tensor& member, int64_t isa) {
  check_isa(isa);
  check_pool(q, k, v);
  TORCH_CHECK(idx.dim() == 2 && idx.size(0) == q.size(0) && idx.is_contiguous() && idx.scalar_type() == at::kLong,
              "idx must be a contiguous int64 [B, Ls] tensor");
  TORCH_CHECK(counts.numel() == q.size(0) && counts.scalar_type() == at::kLong && counts.is_contiguous(),
              "counts must be int64 [B]");
  TORCH_CHECK(prefix.dim() == 1 && prefix.scalar_type() == at::kLong && prefix.is_contiguous(), "prefix must be int64 [P]");
  TORCH_CHECK(member.numel() == q.size(0) && member.scalar_type() == at::kBool && member.is_contiguous(),
              "member must be bool [B]");
  return run_all(decode_tasks(q, k, idx, counts, prefix, member), q, k, v, isa);
}

at::Tensor extend_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& table,
                            const at::Tensor& seq_lens, const at::Tensor& ext_lens, int64_t isa) {
  check_isa(isa);
  check_pool(q, k, v);
  TORCH_CHECK(table.dim() == 2 && table.scalar_type() == at::kLong && table.stride(1) == 1, "table must be int64 [R, L] with contiguous rows");
  TORCH_CHECK(seq_lens.scalar_type() == at::kLong && ext_lens.scalar_type() == at::kLong && seq_lens.is_contiguous() &&
              ext_lens.is_contiguous() && seq_lens.numel() == table.size(0) && ext_lens.numel() == table.size(0),
              "seq_lens and ext_lens must be int64 [R]");
  return run_all(extend_tasks(q, k, table, seq_lens, ext_lens), q, k, v, isa);
}

}  // namespace radixlm_cpu

TORCH_LIBRARY_FRAGMENT(radixlm_cpu, m) {
  m.def("decode_attention(Tensor q, Tensor k, Tensor v, Tensor idx, Tensor counts, Tensor prefix, Tensor member, "
        "int isa) -> Tensor");
  m.def("extend_attention(Tensor q, Tensor k, Tensor v, Tensor table, Tensor seq_lens, Tensor ext_lens, int isa) -> Tensor");
}

TORCH_LIBRARY_IMPL(radixlm_cpu, CPU, m) {
  m.impl("decode_attention", &radixlm_cpu::decode_attention);
  m.impl("extend_attention", &radixlm_cpu::extend_attention);
}
