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

namespace radixlm_cpu {

struct Rows {  // where one task's keys / values are: a shared prefix's slots, then its own
  const int64_t* prefix;
  int64_t prefix_len;
  const int64_t* own;
  int64_t len;  // prefix_len + own count
  int64_t slot(int64_t t) const { return t < prefix_len ? prefix[t] : own[t - prefix_len]; }
};

struct QueryRows {  // row r of a task's queries (or outputs): base + (r / g) * token_stride + (r % g) * D
  int64_t n, g, token_stride;
  int64_t offset(int64_t r, int64_t d) const { return (r / g) * token_stride + (r % g) * d; }
};

struct Scratch {
  std::vector<float> scores, inv_sum;
  std::vector<uint16_t> probs;
};

}  // namespace radixlm_cpu

using radixlm_cpu::QueryRows;
using radixlm_cpu::Rows;
using radixlm_cpu::Scratch;
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

void check_pool(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  TORCH_CHECK(q.dim() == 3 && q.is_contiguous(), "q must be a contiguous [T, Hq, D] tensor");
  TORCH_CHECK(k.dim() == 3 && k.stride(2) == 1 && k.stride(1) == q.size(2) && v.strides() == k.strides() &&
              v.sizes() == k.sizes(), "k and v must be head-major [Hkv, S, D] pools with contiguous rows");
  TORCH_CHECK(k.scalar_type() == q.scalar_type() && v.scalar_type() == q.scalar_type(), "q, k and v dtypes differ");
  TORCH_CHECK(q.scalar_type() == at::kFloat || q.scalar_type() == at::kBFloat16, "q must be float32 or bfloat16");
  TORCH_CHECK(q.size(2) == 64 || q.size(2) == 128, "head dim must be 64 or 128, got ", q.size(2));
  TORCH_CHECK(q.size(1) % k.size(0) == 0 && q.size(1) / k.size(0) <= 16, "query heads must be 1-16 per KV head");
}

template <int DC, typename T>
void decode_all(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& idx,
                const at::Tensor& counts, const at::Tensor& prefix, const at::Tensor& member, at::Tensor& out,
                int64_t isa) {
  const int64_t b_count = q.size(0), hq = q.size(1), hkv = k.size(0), ls = idx.size(1);
  const int64_t d = DC * 16, g_count = hq / hkv, head_stride = k.stride(0);
  const T* qd = q.data_ptr<T>();
  const T* kd = k.data_ptr<T>();
  const T* vd = v.data_ptr<T>();
  const int64_t* id = idx.data_ptr<int64_t>();
  const int64_t* cd = counts.data_ptr<int64_t>();
  const bool* md = member.data_ptr<bool>();
  T* od = out.data_ptr<T>();
  const float scale = 1.f / std::sqrt(static_cast<float>(d));
  at::parallel_for(0, hkv * b_count, 1, [&](int64_t begin, int64_t end) {
    Scratch scratch;
    for (int64_t task = begin; task < end; ++task) {  // head-major: a head's prefix stays in cache
      const int64_t h = task / b_count, b = task % b_count;
      const int64_t pre = md[b] ? prefix.size(0) : 0;
      const Rows rows{prefix.data_ptr<int64_t>(), pre, id + b * ls, pre + cd[b]};
      const QueryRows qr{1, g_count, hq * d};
      const int64_t at = (b * hq + h * g_count) * d;
      attend<DC, T>(isa, qd + at, qr, kd + h * head_stride, vd + h * head_stride, rows, scale, scratch, od + at);
    }
  });
}

constexpr int64_t kChunk = 16;  // query tokens a task: long prompts split across threads

struct Task { int64_t req, c0, c1, q0; };

template <int DC, typename T>
void extend_all(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& table,
                const int64_t* seq, const int64_t* ext, const std::vector<Task>& tasks, at::Tensor& out, int64_t isa) {
  const int64_t hq = q.size(1), hkv = k.size(0), d = DC * 16, g = hq / hkv;
  const T* qd = q.data_ptr<T>();
  const T* kd = k.data_ptr<T>();
  const T* vd = v.data_ptr<T>();
  T* od = out.data_ptr<T>();
  const float scale = 1.f / std::sqrt(static_cast<float>(d));
  const int64_t n_tasks = static_cast<int64_t>(tasks.size());
  at::parallel_for(0, n_tasks * hkv, 1, [&](int64_t begin, int64_t end) {
    Scratch scratch;
    for (int64_t i = begin; i < end; ++i) {
      const Task& t = tasks[i / hkv];
      const int64_t h = i % hkv;
      const Rows rows{nullptr, 0, table.data_ptr<int64_t>() + t.req * table.stride(0), seq[t.req] - ext[t.req] + t.c1};
      const QueryRows qr{t.c1 - t.c0, g, hq * d};
      const int64_t at = (t.q0 + t.c0) * hq * d + h * g * d;
      attend<DC, T>(isa, qd + at, qr, kd + h * k.stride(0), vd + h * k.stride(0), rows, scale, scratch, od + at);
    }
  });
}

}  // namespace

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
  at::Tensor out = at::empty({q.size(0), q.size(1) * q.size(2)}, q.options());
  const bool bf16 = q.scalar_type() == at::kBFloat16;
  if (q.size(2) == 64) {
    bf16 ? decode_all<4, at::BFloat16>(q, k, v, idx, counts, prefix, member, out, isa)
         : decode_all<4, float>(q, k, v, idx, counts, prefix, member, out, isa);
  } else {
    bf16 ? decode_all<8, at::BFloat16>(q, k, v, idx, counts, prefix, member, out, isa)
         : decode_all<8, float>(q, k, v, idx, counts, prefix, member, out, isa);
  }
  return out;
}

// Prefill / extend: request r's ext[r] new tokens (q rows start[r] ..) attend causally to its slots
// table[r, :seq[r]] (its cached prefix, then the new tokens, already stored).
at::Tensor extend_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& table,
                            const at::Tensor& seq_lens, const at::Tensor& ext_lens, int64_t isa) {
  check_isa(isa);
  check_pool(q, k, v);
  TORCH_CHECK(table.dim() == 2 && table.scalar_type() == at::kLong && table.stride(1) == 1, "table must be int64 [R, L] with contiguous rows");
  TORCH_CHECK(seq_lens.scalar_type() == at::kLong && ext_lens.scalar_type() == at::kLong && seq_lens.is_contiguous() &&
              ext_lens.is_contiguous() && seq_lens.numel() == table.size(0) && ext_lens.numel() == table.size(0),
              "seq_lens and ext_lens must be int64 [R]");
  const int64_t* seq = seq_lens.data_ptr<int64_t>();
  const int64_t* ext = ext_lens.data_ptr<int64_t>();
  std::vector<Task> tasks;
  int64_t q0 = 0;
  for (int64_t r = 0; r < table.size(0); ++r) {
    TORCH_CHECK(ext[r] >= 1 && ext[r] <= seq[r] && seq[r] <= table.size(1), "request ", r, ": bad lengths");
    for (int64_t c0 = 0; c0 < ext[r]; c0 += kChunk) tasks.push_back({r, c0, std::min(ext[r], c0 + kChunk), q0});
    q0 += ext[r];
  }
  TORCH_CHECK(q0 == q.size(0), "q has ", q.size(0), " rows; the requests extend by ", q0);
  at::Tensor out = at::empty({q.size(0), q.size(1) * q.size(2)}, q.options());
  const bool bf16 = q.scalar_type() == at::kBFloat16;
  if (q.size(2) == 64) {
    bf16 ? extend_all<4, at::BFloat16>(q, k, v, table, seq, ext, tasks, out, isa)
         : extend_all<4, float>(q, k, v, table, seq, ext, tasks, out, isa);
  } else {
    bf16 ? extend_all<8, at::BFloat16>(q, k, v, table, seq, ext, tasks, out, isa)
         : extend_all<8, float>(q, k, v, table, seq, ext, tasks, out, isa);
  }
  return out;
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
