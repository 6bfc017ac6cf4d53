// Decode attention on AVX512 CPUs straight from the paged KV pool: one query token per request, its keys
// and values read through its slot list (no gather, no padding). Torch reference: cpu_decode_attention.py.
//
// q [B, Hq, D] (float32 or bfloat16); k, v one layer's pool [Hkv, S, D] in q's dtype, head-major; idx
// [B, Ls] int64 slots of each request's own part, the first counts[b] of them valid; prefix [P] int64
// slots of a shared prefix that the requests with member[b] != 0 attend to first (P may be 0).
// -> out [B, Hq * D]. D is 64 or 128; the G = Hq / Hkv query heads of a KV head share its reads.
// One task per (request, KV head): scores in float32, exact softmax (max, exp, sum) over the whole row.
// Loop order keeps a KV head's shared prefix hot in L2 across the requests of one thread.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "cpu_simd.h"

namespace {

using radixlm_simd::exp16;
using radixlm_simd::load16;
using radixlm_simd::store16;

struct Rows {  // where one task's keys / values are
  const int64_t* prefix;
  int64_t prefix_len;
  const int64_t* own;
  int64_t len;  // prefix_len + own count
  int64_t slot(int64_t t) const { return t < prefix_len ? prefix[t] : own[t - prefix_len]; }
};

// Slots are scattered through the pool: fetch the row kAhead tokens on while this one is computed.
constexpr int64_t kAhead = 16;

template <typename T>
inline void prefetch_row(const T* base, const Rows& rows, int64_t t, int64_t len, int64_t bytes) {
  if (t >= len) return;
  const char* p = reinterpret_cast<const char*>(base + rows.slot(t) * (bytes / sizeof(T)));
  for (int64_t off = 0; off < bytes; off += 64) _mm_prefetch(p + off, _MM_HINT_T0);
}

inline void store_probs(float* dst, __m512 e) { _mm512_storeu_ps(dst, e); }
#ifdef RADIXLM_AVX512_BF16
inline void store_probs(uint16_t* dst, __m512 e) {  // as bfloat16
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(e)));
}
#endif

// A row's softmax numerators over its first live_len keys into probs (0 beyond them; probs may be s
// itself) -> 1 / their sum.
template <typename P>
float softmax_row(const float* s, int64_t live_len, int64_t stride, P* probs) {
  __m512 mx = _mm512_set1_ps(-INFINITY);
  for (int64_t t = 0; t < live_len; t += 16) {
    const __mmask16 live = live_len - t >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (live_len - t)) - 1);
    mx = _mm512_mask_max_ps(mx, live, mx, _mm512_loadu_ps(s + t));
  }
  const __m512 m = _mm512_set1_ps(_mm512_reduce_max_ps(mx));
  __m512 sum = _mm512_setzero_ps();
  for (int64_t t = 0; t < stride; t += 16) {
    const int64_t left = live_len - t;
    const __mmask16 live = left >= 16 ? 0xFFFF : left <= 0 ? 0 : static_cast<__mmask16>((1u << left) - 1);
    const __m512 e = _mm512_maskz_mov_ps(live, exp16(_mm512_sub_ps(_mm512_loadu_ps(s + t), m)));
    store_probs(probs + t, e);
    sum = _mm512_add_ps(sum, e);
  }
  return 1.f / _mm512_reduce_add_ps(sum);
}

// One (request, KV head): q rows qh [G, D] -> out rows [G, D]. DC = D / 16 vectors a row.
template <int DC, typename T>
void attend_one(const T* qh, const T* kh, const T* vh, const Rows& rows, int g_count, float scale,
                std::vector<float>& scores, T* out) {
  constexpr int D = DC * 16;
  const int64_t len = rows.len, stride = (len + 15) / 16 * 16;
  scores.assign(g_count * stride, -INFINITY);
  __m512 qv[16][DC];  // g_count <= 16
  for (int g = 0; g < g_count; ++g)
    for (int c = 0; c < DC; ++c) qv[g][c] = _mm512_mul_ps(load16(qh + g * D + 16 * c), _mm512_set1_ps(scale));
  for (int64_t t = 0; t < len; ++t) {
    prefetch_row(kh, rows, t + kAhead, len, D * sizeof(T));
    const T* kp = kh + rows.slot(t) * D;
    __m512 kv[DC];
    for (int c = 0; c < DC; ++c) kv[c] = load16(kp + 16 * c);
    for (int g = 0; g < g_count; ++g) {
      __m512 acc = _mm512_mul_ps(qv[g][0], kv[0]);
      for (int c = 1; c < DC; ++c) acc = _mm512_fmadd_ps(qv[g][c], kv[c], acc);
      scores[g * stride + t] = _mm512_reduce_add_ps(acc);
    }
  }
  float inv_sum[16];
  for (int g = 0; g < g_count; ++g) {  // softmax numerators in place
    float* sg = scores.data() + g * stride;
    inv_sum[g] = softmax_row(sg, len, stride, sg);
  }
  __m512 acc[16][DC];
  for (int g = 0; g < g_count; ++g)
    for (int c = 0; c < DC; ++c) acc[g][c] = _mm512_setzero_ps();
  for (int64_t t = 0; t < len; ++t) {
    prefetch_row(vh, rows, t + kAhead, len, D * sizeof(T));
    const T* vp = vh + rows.slot(t) * D;
    __m512 vv[DC];
    for (int c = 0; c < DC; ++c) vv[c] = load16(vp + 16 * c);
    for (int g = 0; g < g_count; ++g) {
      const __m512 p = _mm512_set1_ps(scores[g * stride + t]);
      for (int c = 0; c < DC; ++c) acc[g][c] = _mm512_fmadd_ps(p, vv[c], acc[g][c]);
    }
  }
  for (int g = 0; g < g_count; ++g)
    for (int c = 0; c < DC; ++c) store16(out + g * D + 16 * c, _mm512_mul_ps(acc[g][c], _mm512_set1_ps(inv_sum[g])));
}


#ifdef RADIXLM_AVX512_BF16
// bfloat16 pools on CPUs with AVX512-BF16: q . k and p . v as vdpbf16ps (pairs of bf16 products summed into
// float32 lanes), so K and V are never widened to float32, and q . k is summed across lanes 4 keys at a time.
// One task holds n query tokens x G query heads = R rows; row r = (token r / G, head r % G) sees keys
// [0, len - n + r / G] (causal; decode: n = 1, every key). Scores [R, stride] float32, probs bf16.

struct QueryRows {  // row r of a task's queries (or outputs): base + (r / g) * token_stride + (r % g) * D
  int64_t n, g, token_stride;
  int64_t offset(int64_t r, int64_t d) const { return (r / g) * token_stride + (r % g) * d; }
};

// [sum(a0), sum(a1), sum(a2), sum(a3)]
inline __m128 reduce4(__m512 a0, __m512 a1, __m512 a2, __m512 a3) {
  const __m512 s01 = _mm512_add_ps(_mm512_unpacklo_ps(a0, a1), _mm512_unpackhi_ps(a0, a1));
  const __m512 s23 = _mm512_add_ps(_mm512_unpacklo_ps(a2, a3), _mm512_unpackhi_ps(a2, a3));
  const __m512 v = _mm512_add_ps(_mm512_shuffle_ps(s01, s23, _MM_SHUFFLE(1, 0, 1, 0)),
                                 _mm512_shuffle_ps(s01, s23, _MM_SHUFFLE(3, 2, 3, 2)));  // per 128-bit lane
  const __m512 w = _mm512_add_ps(v, _mm512_shuffle_f32x4(v, v, _MM_SHUFFLE(1, 0, 3, 2)));
  return _mm512_castps512_ps128(_mm512_add_ps(w, _mm512_shuffle_f32x4(w, w, _MM_SHUFFLE(2, 3, 0, 1))));
}

inline __m512bh as_bh(__m512i v) { return reinterpret_cast<__m512bh>(v); }
inline __m512i load_bf16x32(const at::BFloat16* p) { return _mm512_loadu_si512(p); }

// scores[r * stride + t] = scale * q_r . k_t for every row and key (masking is the softmax's job).
template <int KZ>
void scores_bf16(const at::BFloat16* q, const QueryRows& qr, const at::BFloat16* kh, const Rows& rows,
                 float scale, int64_t stride, float* scores) {
  constexpr int D = KZ * 32;
  const int64_t len = rows.len, r_count = qr.n * qr.g;
  const __m128 sc = _mm_set1_ps(scale);
  int64_t t = 0;
  for (; t + 4 <= len; t += 4) {
    __m512i kv[4][KZ];
    for (int j = 0; j < 4; ++j) {
      prefetch_row(kh, rows, t + j + kAhead, len, D * 2);
      const at::BFloat16* kp = kh + rows.slot(t + j) * D;
      for (int c = 0; c < KZ; ++c) kv[j][c] = load_bf16x32(kp + 32 * c);
    }
    for (int64_t r = 0; r < r_count; ++r) {
      const at::BFloat16* qp = q + qr.offset(r, D);
      __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
      for (int c = 0; c < KZ; ++c) {
        const __m512bh qc = as_bh(load_bf16x32(qp + 32 * c));
        for (int j = 0; j < 4; ++j) acc[j] = _mm512_dpbf16_ps(acc[j], qc, as_bh(kv[j][c]));
      }
      _mm_storeu_ps(scores + r * stride + t, _mm_mul_ps(reduce4(acc[0], acc[1], acc[2], acc[3]), sc));
    }
  }
  for (; t < len; ++t) {
    const at::BFloat16* kp = kh + rows.slot(t) * D;
    for (int64_t r = 0; r < r_count; ++r) {
      const at::BFloat16* qp = q + qr.offset(r, D);
      __m512 acc = _mm512_setzero_ps();
      for (int c = 0; c < KZ; ++c) acc = _mm512_dpbf16_ps(acc, as_bh(load_bf16x32(qp + 32 * c)), as_bh(load_bf16x32(kp + 32 * c)));
      scores[r * stride + t] = _mm512_reduce_add_ps(acc) * scale;
    }
  }
}

// out rows [r0, r0 + RB) = sum_t p[r, t] v_t / sum, with p as bf16 pairs (keys t, t + 1) against V rows
// interleaved pairwise. unpacklo/hi_epi16 interleave within 128-bit lanes: lo holds dims 8L..8L+3 of
// lane L, hi 8L+4..8L+7. The pairs run to the last key any of the RB rows sees.
template <int KZ, int RB>
void values_bf16(const uint16_t* probs, int64_t stride, int64_t r0, int64_t keys, const at::BFloat16* vh,
                 const Rows& rows, const float* inv_sum, at::BFloat16* out, const QueryRows& orow) {
  constexpr int D = KZ * 32;
  __m512 lo[RB][KZ], hi[RB][KZ];
  for (int i = 0; i < RB; ++i)
    for (int c = 0; c < KZ; ++c) lo[i][c] = hi[i][c] = _mm512_setzero_ps();
  for (int64_t t = 0; t < keys; t += 2) {
    prefetch_row(vh, rows, t + kAhead, keys, D * 2);
    prefetch_row(vh, rows, t + 1 + kAhead, keys, D * 2);
    const at::BFloat16* v0 = vh + rows.slot(t) * D;
    const at::BFloat16* v1 = t + 1 < keys ? vh + rows.slot(t + 1) * D : v0;  // its probability is 0
    __m512bh pp[RB];
    for (int i = 0; i < RB; ++i) {
      int32_t pair;
      std::memcpy(&pair, probs + (r0 + i) * stride + t, 4);
      pp[i] = as_bh(_mm512_set1_epi32(pair));
    }
    for (int c = 0; c < KZ; ++c) {
      const __m512i a = load_bf16x32(v0 + 32 * c), b = load_bf16x32(v1 + 32 * c);
      const __m512bh pl = as_bh(_mm512_unpacklo_epi16(a, b)), ph = as_bh(_mm512_unpackhi_epi16(a, b));
      for (int i = 0; i < RB; ++i) {
        lo[i][c] = _mm512_dpbf16_ps(lo[i][c], pl, pp[i]);
        hi[i][c] = _mm512_dpbf16_ps(hi[i][c], ph, pp[i]);
      }
    }
  }
  // back to dim order: lo lanes 4L..4L+3 are dims 8L..8L+3, hi's are 8L+4..8L+7
  const __m512i first = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
  const __m512i second = _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
  for (int i = 0; i < RB; ++i) {
    const __m512 inv = _mm512_set1_ps(inv_sum[r0 + i]);
    at::BFloat16* o = out + orow.offset(r0 + i, D);
    for (int c = 0; c < KZ; ++c) {
      store16(o + 32 * c, _mm512_mul_ps(_mm512_permutex2var_ps(lo[i][c], first, hi[i][c]), inv));
      store16(o + 32 * c + 16, _mm512_mul_ps(_mm512_permutex2var_ps(lo[i][c], second, hi[i][c]), inv));
    }
  }
}

struct Scratch {
  std::vector<float> scores, inv_sum;
  std::vector<uint16_t> probs;
};

// One task: n query tokens x G heads of one KV head over rows (causal for n > 1). KZ = D / 32.
template <int KZ>
void attend_rows_bf16(const at::BFloat16* q, const QueryRows& qr, const at::BFloat16* kh, const at::BFloat16* vh,
                      const Rows& rows, float scale, Scratch& scratch, at::BFloat16* out, const QueryRows& orow) {
  const int64_t len = rows.len, stride = (len + 15) / 16 * 16, r_count = qr.n * qr.g;
  scratch.scores.resize(r_count * stride);
  scratch.probs.resize(r_count * stride);
  scratch.inv_sum.resize(r_count);
  scores_bf16<KZ>(q, qr, kh, rows, scale, stride, scratch.scores.data());
  auto live_len = [&](int64_t r) { return len - qr.n + r / qr.g + 1; };
  for (int64_t r = 0; r < r_count; ++r) {
    scratch.inv_sum[r] = softmax_row(scratch.scores.data() + r * stride, live_len(r), stride,
                                     scratch.probs.data() + r * stride);
  }
  int64_t r0 = 0;
  for (; r0 + 4 <= r_count; r0 += 4) {
    values_bf16<KZ, 4>(scratch.probs.data(), stride, r0, live_len(r0 + 3), vh, rows, scratch.inv_sum.data(), out, orow);
  }
  for (; r0 < r_count; ++r0) {
    values_bf16<KZ, 1>(scratch.probs.data(), stride, r0, live_len(r0), vh, rows, scratch.inv_sum.data(), out, orow);
  }
}
#endif

template <int DC, typename T>
void attend_all(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& idx,
                const at::Tensor& counts, const at::Tensor& prefix, const at::Tensor& member, at::Tensor& out) {
  const int64_t b_count = q.size(0), hq = q.size(1), hkv = k.size(0), ls = idx.size(1);
  const int64_t d = DC * 16, g_count = hq / hkv, head_stride = k.stride(0);
  const T* qd = q.data_ptr<T>();
  const T* kd = k.data_ptr<T>();
  const T* vd = v.data_ptr<T>();
  const int64_t* id = idx.data_ptr<int64_t>();
  const int64_t* cd = counts.data_ptr<int64_t>();
  const bool* md = member.data_ptr<bool>();
  T* od = out.data_ptr<T>();
  at::parallel_for(0, hkv * b_count, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores;
#ifdef RADIXLM_AVX512_BF16
    Scratch scratch;
#endif
    for (int64_t task = begin; task < end; ++task) {  // head-major: a head's prefix stays in cache
      const int64_t h = task / b_count, b = task % b_count;
      const int64_t pre = md[b] ? prefix.size(0) : 0;
      const Rows rows{prefix.data_ptr<int64_t>(), pre, id + b * ls, pre + cd[b]};
      const float scale = 1.f / std::sqrt(static_cast<float>(d));
      const int64_t at = (b * hq + h * g_count) * d;
#ifdef RADIXLM_AVX512_BF16
      if constexpr (std::is_same_v<T, at::BFloat16>) {
        const QueryRows qr{1, g_count, hq * d};
        attend_rows_bf16<DC / 2>(qd + at, qr, kd + h * head_stride, vd + h * head_stride, rows, scale, scratch,
                                 od + at, qr);
        continue;
      }
#endif
      attend_one<DC, T>(qd + at, kd + h * head_stride, vd + h * head_stride, rows, static_cast<int>(g_count),
                        scale, scores, od + at);
    }
  });
}

at::Tensor decode_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& idx,
                            const at::Tensor& counts, const at::Tensor& prefix, const at::Tensor& member) {
  TORCH_CHECK(q.dim() == 3 && q.is_contiguous(), "q must be a contiguous [B, Hq, D] tensor");
  TORCH_CHECK(k.dim() == 3 && k.stride(2) == 1 && k.stride(1) == q.size(2) && v.strides() == k.strides(),
              "k and v must be head-major [Hkv, S, D] pools with contiguous rows");
  TORCH_CHECK(k.scalar_type() == q.scalar_type() && v.scalar_type() == q.scalar_type(), "q, k and v dtypes differ");
  TORCH_CHECK(q.scalar_type() == at::kFloat || q.scalar_type() == at::kBFloat16, "q must be float32 or bfloat16");
  TORCH_CHECK(q.size(1) % k.size(0) == 0 && q.size(1) / k.size(0) <= 16, "query heads must be 1-16 per KV head");
  TORCH_CHECK(idx.dim() == 2 && idx.size(0) == q.size(0) && idx.is_contiguous() && idx.scalar_type() == at::kLong,
              "idx must be a contiguous int64 [B, Ls] tensor");
  TORCH_CHECK(counts.numel() == q.size(0) && counts.scalar_type() == at::kLong && counts.is_contiguous(),
              "counts must be int64 [B]");
  TORCH_CHECK(prefix.dim() == 1 && prefix.scalar_type() == at::kLong && prefix.is_contiguous(), "prefix must be int64 [P]");
  TORCH_CHECK(member.numel() == q.size(0) && member.scalar_type() == at::kBool && member.is_contiguous(),
              "member must be bool [B]");
  at::Tensor out = at::empty({q.size(0), q.size(1) * q.size(2)}, q.options());
  const int64_t d = q.size(2);
  TORCH_CHECK(d == 64 || d == 128, "head dim must be 64 or 128, got ", d);
  const bool bf16 = q.scalar_type() == at::kBFloat16;
  if (d == 64) {
    bf16 ? attend_all<4, at::BFloat16>(q, k, v, idx, counts, prefix, member, out)
         : attend_all<4, float>(q, k, v, idx, counts, prefix, member, out);
  } else {
    bf16 ? attend_all<8, at::BFloat16>(q, k, v, idx, counts, prefix, member, out)
         : attend_all<8, float>(q, k, v, idx, counts, prefix, member, out);
  }
  return out;
}


#ifdef RADIXLM_AVX512_BF16
constexpr int64_t kChunk = 16;  // query tokens a task: long prompts split across threads

// Prefill / extend: request r's ext[r] new tokens (q rows start[r] ..) attend causally to its slots
// table[r, :seq[r]] (its cached prefix, then the new tokens, already stored). bfloat16 only.
at::Tensor extend_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& table,
                            const at::Tensor& seq_lens, const at::Tensor& ext_lens) {
  TORCH_CHECK(q.dim() == 3 && q.is_contiguous() && q.scalar_type() == at::kBFloat16, "q must be a contiguous bfloat16 [T, Hq, D] tensor");
  TORCH_CHECK(k.dim() == 3 && k.stride(2) == 1 && k.stride(1) == q.size(2) && v.strides() == k.strides() &&
              k.scalar_type() == at::kBFloat16 && v.scalar_type() == at::kBFloat16,
              "k and v must be head-major bfloat16 [Hkv, S, D] pools with contiguous rows");
  TORCH_CHECK(q.size(2) == 64 || q.size(2) == 128, "head dim must be 64 or 128, got ", q.size(2));
  TORCH_CHECK(q.size(1) % k.size(0) == 0, "query heads must be a multiple of KV heads");
  TORCH_CHECK(table.dim() == 2 && table.scalar_type() == at::kLong && table.stride(1) == 1, "table must be int64 [R, L] with contiguous rows");
  TORCH_CHECK(seq_lens.scalar_type() == at::kLong && ext_lens.scalar_type() == at::kLong && seq_lens.is_contiguous() &&
              ext_lens.is_contiguous() && seq_lens.numel() == table.size(0) && ext_lens.numel() == table.size(0),
              "seq_lens and ext_lens must be int64 [R]");
  const int64_t r_count = table.size(0), hq = q.size(1), hkv = k.size(0), d = q.size(2), g = hq / hkv;
  const int64_t* seq = seq_lens.data_ptr<int64_t>();
  const int64_t* ext = ext_lens.data_ptr<int64_t>();
  struct Task { int64_t req, c0, c1, q0; };
  std::vector<Task> tasks;
  int64_t q0 = 0;
  for (int64_t r = 0; r < r_count; ++r) {
    TORCH_CHECK(ext[r] >= 1 && ext[r] <= seq[r] && seq[r] <= table.size(1), "request ", r, ": bad lengths");
    for (int64_t c0 = 0; c0 < ext[r]; c0 += kChunk) tasks.push_back({r, c0, std::min(ext[r], c0 + kChunk), q0});
    q0 += ext[r];
  }
  TORCH_CHECK(q0 == q.size(0), "q has ", q.size(0), " rows; the requests extend by ", q0);
  at::Tensor out = at::empty({q.size(0), hq * d}, q.options());
  const auto* qd = q.data_ptr<at::BFloat16>();
  const auto* kd = k.data_ptr<at::BFloat16>();
  const auto* vd = v.data_ptr<at::BFloat16>();
  auto* od = out.data_ptr<at::BFloat16>();
  const int64_t n_tasks = static_cast<int64_t>(tasks.size());
  const float scale = 1.f / std::sqrt(static_cast<float>(d));
  at::parallel_for(0, n_tasks * hkv, 1, [&](int64_t begin, int64_t end) {
    Scratch scratch;
    for (int64_t i = begin; i < end; ++i) {
      const Task& t = tasks[i / hkv];
      const int64_t h = i % hkv;
      const int64_t prefix = seq[t.req] - ext[t.req];
      const Rows rows{nullptr, 0, table.data_ptr<int64_t>() + t.req * table.stride(0), prefix + t.c1};
      const QueryRows qr{t.c1 - t.c0, g, hq * d};
      const int64_t at = (t.q0 + t.c0) * hq * d + h * g * d;
      if (d == 64) {
        attend_rows_bf16<2>(qd + at, qr, kd + h * k.stride(0), vd + h * k.stride(0), rows, scale, scratch, od + at, qr);
      } else {
        attend_rows_bf16<4>(qd + at, qr, kd + h * k.stride(0), vd + h * k.stride(0), rows, scale, scratch, od + at, qr);
      }
    }
  });
  return out;
}
#endif

}  // namespace

TORCH_LIBRARY_FRAGMENT(radixlm_cpu, m) {
  m.def("decode_attention(Tensor q, Tensor k, Tensor v, Tensor idx, Tensor counts, Tensor prefix, Tensor member) -> Tensor");
  m.def("extend_attention(Tensor q, Tensor k, Tensor v, Tensor table, Tensor seq_lens, Tensor ext_lens) -> Tensor");
}

TORCH_LIBRARY_IMPL(radixlm_cpu, CPU, m) {
  m.impl("decode_attention", &decode_attention);
#ifdef RADIXLM_AVX512_BF16
  m.impl("extend_attention", &extend_attention);
#endif
}
