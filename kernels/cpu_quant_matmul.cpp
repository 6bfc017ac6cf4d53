// Weight-only int4 / int8 matmuls for small batches on AVX512-VNNI CPUs: x [M, K] (float32 or bfloat16)
// times a quantized W [N, K]^T -> y [M, N] in x's dtype. Torch reference: cpu_quant_matmul.py.
//
// The activations are quantized on the fly to int8, one scale per block of 64 along K (a = max|x| / 127,
// measured lossless on SmolLM2: NLL 3.4144 vs 3.4156), so the inner product is VNNI's u8 x s8 -> int32
// (vpdpbusd, 64 multiply-adds an instruction) instead of float FMAs: at 8 rows the float kernels are
// compute bound on 2 cores.
//
// Weights are tiled 16 output rows at a time, so a vector lane is an output row: lane j of a 64-byte
// vector holds 4 consecutive k of row j, vpdpbusd takes the 4 matching activation bytes broadcast, and
// the float scales apply to 16 rows at once (no horizontal sums). N must be a multiple of 16.
// int4: q in [0, 15], w = d * q + mn per group of 32 along K (GGUF's Q4_1). codes [N/16, K/4, 32] bytes:
//   for a tile and a k-quad, byte p holds row p/4's k % 4 = p % 4 in its low nibble and row 8 + p/4's in
//   its high nibble; d, mn float16 [N/16, K/32, 16]. sum_k w x = sum_g d_g a sum(q xq) + mn_g a sum(xq).
// int8: w = s * q, q int8 [N/16, K/4, 64] (16 rows x 4 k), s float32 [N]; q + 128 is the unsigned
//   operand, and the 128 * sum(xq) this adds is subtracted once per row of x.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <cstring>
#include <vector>

#include "cpu_simd.h"

namespace {

using radixlm_simd::dispatch_float_bf16;
using radixlm_simd::load16;
using radixlm_simd::store16;

constexpr int kBlock = 64;
constexpr int kPrefetch = 8;  // groups of 32 ahead (256 bytes of int4 codes each)

// x quantized per 64-block: q [M, K] int8, a [M, nb], and per row either t [M, G] = a * sum(xq) per
// group of 32 (int4) or corr [M] = 128 * sum_b a_b sum(xq)_b (int8).
struct QuantizedX {
  std::vector<int8_t> q;
  std::vector<float> a, t;
  int64_t k = 0, nb = 0;
};

template <typename T>
QuantizedX quantize_x(const T* x, int64_t m, int64_t k, bool group_sums) {
  QuantizedX out;
  out.k = k;
  out.nb = k / kBlock;
  out.q.resize(m * k);
  out.a.resize(m * out.nb);
  out.t.assign(group_sums ? m * 2 * out.nb : m, 0.f);
  at::parallel_for(0, m, 16, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      for (int64_t b = 0; b < out.nb; ++b) {
        const T* src = x + i * k + b * kBlock;
        __m512 v[4];
        __m512 amax = _mm512_setzero_ps();
        for (int j = 0; j < 4; ++j) {
          v[j] = load16(src + 16 * j);
          amax = _mm512_max_ps(amax, _mm512_abs_ps(v[j]));
        }
        const float mx = _mm512_reduce_max_ps(amax);
        const float a = mx / 127.f;
        const __m512 inv = _mm512_set1_ps(mx > 0.f ? 127.f / mx : 0.f);
        __m512i iv[4];
        for (int j = 0; j < 4; ++j) iv[j] = _mm512_cvtps_epi32(_mm512_mul_ps(v[j], inv));  // round to even
        const int s0 = _mm512_reduce_add_epi32(_mm512_add_epi32(iv[0], iv[1]));
        const int s1 = _mm512_reduce_add_epi32(_mm512_add_epi32(iv[2], iv[3]));
        int8_t* dst = out.q.data() + i * k + b * kBlock;
        for (int j = 0; j < 4; ++j) _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 16 * j), _mm512_cvtsepi32_epi8(iv[j]));
        if (group_sums) {
          out.t[(i * out.nb + b) * 2] = a * s0;
          out.t[(i * out.nb + b) * 2 + 1] = a * s1;
        } else {
          out.t[i] += 128.f * a * (s0 + s1);
        }
        out.a[i * out.nb + b] = a;
      }
    }
  });
  return out;
}

inline __m512i bcast4(const int8_t* p) {  // 4 activation bytes into every lane
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

// The 16 int4 codes of one k-quad of a tile, one byte each: low nibbles (rows 0-7) in the low half.
inline __m512i int4_quad(const uint8_t* p) {
  const __m256i packed = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  const __m512i both = _mm512_inserti64x4(_mm512_castsi256_si512(packed), _mm256_srli_epi16(packed, 4), 1);
  return _mm512_and_si512(both, _mm512_set1_epi8(0x0F));
}

inline __m512 load_half16(const at::Half* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

// y[m0 : m0 + MT, 16 tile : 16 tile + 16] for int4 weights. Per 64-block of K (one activation scale, two
// weight groups): ip[0], ip[1] are the groups' int32 dot products, scaled as (ip[0] d0 + ip[1] d1) a, plus the
// minimums' mn_g t_g: 5 float ops per row a block (one float conversion per group was 8 and cost ~10%).
template <int MT, typename T>
void int4_tile(const uint8_t* codes, const at::Half* d, const at::Half* mn, int64_t n, int64_t tile,
               const QuantizedX& xq, int64_t m0, T* y) {
  const int64_t k = xq.k, g_count = k / 32;
  const uint8_t* wt = codes + tile * (k / 4) * 32;
  const at::Half* dt = d + tile * g_count * 16;
  const at::Half* mt = mn + tile * g_count * 16;
  const int8_t* xs = xq.q.data() + m0 * k;
  __m512 acc[MT];
  for (int i = 0; i < MT; ++i) acc[i] = _mm512_setzero_ps();
  const int64_t d_next = (tile + 1) * g_count * 16;  // the next tile's scales, read soon after this one
  _mm_prefetch(reinterpret_cast<const char*>(d + d_next), _MM_HINT_T0);
  _mm_prefetch(reinterpret_cast<const char*>(mn + d_next), _MM_HINT_T0);
  for (int64_t b = 0; b < xq.nb; ++b) {
    for (int line = 0; line < 8; ++line) {  // codes kPrefetch groups ahead (they run on into the next tile)
      _mm_prefetch(reinterpret_cast<const char*>(wt + (2 * b + kPrefetch) * 256 + 64 * line), _MM_HINT_T0);
    }
    __m512i ip[2][MT];  // [group of the block][row]
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
      for (int i = 0; i < MT; ++i) ip[h][i] = _mm512_setzero_si512();
#pragma GCC unroll 8
      for (int kq = 8 * h; kq < 8 * h + 8; ++kq) {
        const __m512i wq = int4_quad(wt + (b * 16 + kq) * 32);
        for (int i = 0; i < MT; ++i) ip[h][i] = _mm512_dpbusd_epi32(ip[h][i], wq, bcast4(xs + i * k + b * 64 + kq * 4));
      }
    }
    const __m512 d0 = load_half16(dt + 2 * b * 16), d1 = load_half16(dt + (2 * b + 1) * 16);
    const __m512 n0 = load_half16(mt + 2 * b * 16), n1 = load_half16(mt + (2 * b + 1) * 16);
    for (int i = 0; i < MT; ++i) {
      const float* t = xq.t.data() + ((m0 + i) * xq.nb + b) * 2;  // a sum(xq) of the block's two groups
      __m512 both = _mm512_mul_ps(_mm512_cvtepi32_ps(ip[0][i]), d0);
      both = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ip[1][i]), d1, both);
      acc[i] = _mm512_fmadd_ps(both, _mm512_set1_ps(xq.a[(m0 + i) * xq.nb + b]), acc[i]);
      acc[i] = _mm512_fmadd_ps(n0, _mm512_set1_ps(t[0]), acc[i]);
      acc[i] = _mm512_fmadd_ps(n1, _mm512_set1_ps(t[1]), acc[i]);
    }
  }
  for (int i = 0; i < MT; ++i) store16(y + (m0 + i) * n + tile * 16, acc[i]);
}

// y[m0 : m0 + MT, 16 tile : 16 tile + 16] for int8 weights.
template <int MT, typename T>
void int8_tile(const int8_t* q, const float* s, int64_t n, int64_t tile, const QuantizedX& xq, int64_t m0, T* y) {
  const int64_t k = xq.k;
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  const int8_t* wt = q + tile * (k / 4) * 64;
  const int8_t* xs = xq.q.data() + m0 * k;
  __m512 acc[MT];
  for (int i = 0; i < MT; ++i) acc[i] = _mm512_setzero_ps();
  for (int64_t b = 0; b < xq.nb; ++b) {
    __m512i ip[MT];
    for (int i = 0; i < MT; ++i) ip[i] = _mm512_setzero_si512();
    for (int kq = 0; kq < 16; ++kq) {
      const __m512i wq = _mm512_xor_si512(_mm512_loadu_si512(wt + (b * 16 + kq) * 64), flip);  // q + 128
      for (int i = 0; i < MT; ++i) ip[i] = _mm512_dpbusd_epi32(ip[i], wq, bcast4(xs + i * k + b * 64 + kq * 4));
    }
    for (int i = 0; i < MT; ++i) {
      acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ip[i]), _mm512_set1_ps(xq.a[(m0 + i) * xq.nb + b]), acc[i]);
    }
  }
  const __m512 sv = _mm512_loadu_ps(s + tile * 16);
  for (int i = 0; i < MT; ++i) {
    store16(y + (m0 + i) * n + tile * 16, _mm512_mul_ps(sv, _mm512_sub_ps(acc[i], _mm512_set1_ps(xq.t[m0 + i]))));
  }
}

// Runs tile_fn(MT, tile, m0) over W's 16-row tiles in parallel and x's rows in runs of 8, 4, 2, 1.
template <typename TileFn>
void for_tiles(int64_t m, int64_t n, const TileFn& tile_fn) {
  at::parallel_for(0, n / 16, 4, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      int64_t m0 = 0;
      for (; m0 + 8 <= m; m0 += 8) tile_fn(std::integral_constant<int, 8>{}, t, m0);
      if (m - m0 >= 4) { tile_fn(std::integral_constant<int, 4>{}, t, m0); m0 += 4; }
      if (m - m0 >= 2) { tile_fn(std::integral_constant<int, 2>{}, t, m0); m0 += 2; }
      if (m - m0 >= 1) tile_fn(std::integral_constant<int, 1>{}, t, m0);
    }
  });
}

void check_x(const at::Tensor& x, int64_t k) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous(), "x must be a contiguous [M, K] tensor");
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16, "x must be float32 or bfloat16");
  TORCH_CHECK(x.size(1) == k && k % kBlock == 0, "x has ", x.size(1), " columns; the weight has ", k,
              " (a multiple of 64)");
}

at::Tensor int4_linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& d, const at::Tensor& mn) {
  const int64_t n = d.size(0) * 16, k = d.size(1) * 32, m = x.size(0);
  check_x(x, k);
  TORCH_CHECK(w.scalar_type() == at::kByte && d.scalar_type() == at::kHalf && mn.scalar_type() == at::kHalf,
              "int4 weight: uint8 codes with float16 scales and minimums");
  TORCH_CHECK(w.numel() * 2 == n * k && mn.sizes() == d.sizes(), "int4 weight: codes, scales and minimums disagree");
  at::Tensor y = at::empty({m, n}, x.options());
  dispatch_float_bf16(x, [&](auto* tag) {
    using scalar_t = std::remove_pointer_t<decltype(tag)>;
    const QuantizedX xq = quantize_x(x.data_ptr<scalar_t>(), m, k, true);
    scalar_t* out = y.data_ptr<scalar_t>();
    for_tiles(m, n, [&](auto mt, int64_t t, int64_t m0) {
      int4_tile<decltype(mt)::value>(w.data_ptr<uint8_t>(), d.data_ptr<at::Half>(), mn.data_ptr<at::Half>(), n, t,
                                     xq, m0, out);
    });
  });
  return y;
}

at::Tensor int8_linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& s) {
  const int64_t n = s.size(0), k = w.numel() / n, m = x.size(0);
  TORCH_CHECK(n % 16 == 0, "int8 weight rows must be a multiple of 16, got ", n);
  check_x(x, k);
  TORCH_CHECK(w.scalar_type() == at::kChar && s.scalar_type() == at::kFloat, "int8 weight: int8 with float32 scales");
  at::Tensor y = at::empty({m, n}, x.options());
  dispatch_float_bf16(x, [&](auto* tag) {
    using scalar_t = std::remove_pointer_t<decltype(tag)>;
    const QuantizedX xq = quantize_x(x.data_ptr<scalar_t>(), m, k, false);
    scalar_t* out = y.data_ptr<scalar_t>();
    for_tiles(m, n, [&](auto mt, int64_t t, int64_t m0) {
      int8_tile<decltype(mt)::value>(w.data_ptr<int8_t>(), s.data_ptr<float>(), n, t, xq, m0, out);
    });
  });
  return y;
}

}  // namespace

TORCH_LIBRARY(radixlm_cpu, m) {
  m.def("int4_linear(Tensor x, Tensor w, Tensor d, Tensor mn) -> Tensor");
  m.def("int8_linear(Tensor x, Tensor w, Tensor s) -> Tensor");
}

TORCH_LIBRARY_IMPL(radixlm_cpu, CPU, m) {
  m.impl("int4_linear", &int4_linear);
  m.impl("int8_linear", &int8_linear);
}
