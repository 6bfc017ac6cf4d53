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
#include <vector>

namespace {

inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const at::BFloat16* p) {
  __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(v), 16));
}

inline void store16(float* dst, __m512 v) { _mm512_storeu_ps(dst, v); }
inline void store16(at::BFloat16* dst, __m512 v) {
  alignas(64) float tmp[16];
  _mm512_store_ps(tmp, v);
  for (int j = 0; j < 16; ++j) dst[j] = static_cast<at::BFloat16>(tmp[j]);
}

// exp(x) for x <= 0 (Cephes' expf polynomial, ~1 ulp), 16 lanes.
inline __m512 exp16(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.f)));
  return _mm512_scalef_ps(p, n);
}

struct Rows {  // where one task's keys / values are
  const int64_t* prefix;
  int64_t prefix_len;
  const int64_t* own;
  int64_t len;  // prefix_len + own count
  int64_t slot(int64_t t) const { return t < prefix_len ? prefix[t] : own[t - prefix_len]; }
};

// Slots are scattered through the pool: fetch the row kAhead tokens on while this one is computed.
constexpr int64_t kAhead = 8;

template <typename T>
inline void prefetch_row(const T* base, const Rows& rows, int64_t t, int64_t len, int64_t bytes) {
  if (t >= len) return;
  const char* p = reinterpret_cast<const char*>(base + rows.slot(t) * (bytes / sizeof(T)));
  for (int64_t off = 0; off < bytes; off += 64) _mm_prefetch(p + off, _MM_HINT_T0);
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
    float* s = scores.data() + g * stride;
    __m512 mx = _mm512_set1_ps(-INFINITY);
    for (int64_t t = 0; t < stride; t += 16) mx = _mm512_max_ps(mx, _mm512_loadu_ps(s + t));
    const __m512 m = _mm512_set1_ps(_mm512_reduce_max_ps(mx));
    __m512 sum = _mm512_setzero_ps();
    for (int64_t t = 0; t < stride; t += 16) {
      const __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(s + t), m));  // padding: exp(-87), never read
      _mm512_storeu_ps(s + t, e);
      sum = _mm512_add_ps(sum, e);
    }
    inv_sum[g] = 1.f / _mm512_reduce_add_ps(sum);
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
    for (int64_t task = begin; task < end; ++task) {  // head-major: a head's prefix stays in cache
      const int64_t h = task / b_count, b = task % b_count;
      const int64_t pre = md[b] ? prefix.size(0) : 0;
      const Rows rows{prefix.data_ptr<int64_t>(), pre, id + b * ls, pre + cd[b]};
      attend_one<DC, T>(qd + (b * hq + h * g_count) * d, kd + h * head_stride, vd + h * head_stride, rows,
                        static_cast<int>(g_count), 1.f / std::sqrt(static_cast<float>(d)), scores,
                        od + (b * hq + h * g_count) * d);
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

}  // namespace

TORCH_LIBRARY_FRAGMENT(radixlm_cpu, m) {
  m.def("decode_attention(Tensor q, Tensor k, Tensor v, Tensor idx, Tensor counts, Tensor prefix, Tensor member) -> Tensor");
}

TORCH_LIBRARY_IMPL(radixlm_cpu, CPU, m) { m.impl("decode_attention", &decode_attention); }
