// 16-lane float32 loads, stores and math shared by radixlm's C++ CPU kernels (AVX512F).
// cpu_ext.py passes a hash of this file as a build flag: torch's extension builder versions builds by
// their .cpp sources and flags only, so an edit here still triggers a rebuild.
#pragma once

#include <ATen/ATen.h>
#include <immintrin.h>

namespace radixlm_simd {

inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }

inline __m512 load16(const at::BFloat16* p) {
  const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(v), 16));
}

inline void store16(float* dst, __m512 v) { _mm512_storeu_ps(dst, v); }

// float32 -> bfloat16 rounded to nearest even as c10 does (NaN stays a quiet NaN), in one vector: 16
// scalar conversions took a quarter of an 800-row int4 matmul.
inline void store16(at::BFloat16* dst, __m512 v) {
  const __m512i bits = _mm512_castps_si512(v);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(bits, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7FFF))), 16);
  r = _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), _mm512_set1_epi32(0x7FC0));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), _mm512_cvtepi32_epi16(r));
}

// Calls f with a null pointer of x's element type: float for float32 tensors, else bfloat16.
template <typename F>
void dispatch_float_bf16(const at::Tensor& x, const F& f) {
  if (x.scalar_type() == at::kFloat) {
    f(static_cast<float*>(nullptr));
  } else {
    f(static_cast<at::BFloat16*>(nullptr));
  }
}

// v rounded to bfloat16 precision (nearest even), kept as float32 lanes.
inline __m512 round_bf16(__m512 v) {
  const __m512i bits = _mm512_castps_si512(v);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  const __m512i r = _mm512_add_epi32(bits, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7FFF)));
  return _mm512_castsi512_ps(_mm512_and_si512(r, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u))));
}

// exp(x), 16 lanes (Cephes' expf polynomial, ~1 ulp); x below -87 gives exp(-87), above ~88 +inf.
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

}  // namespace radixlm_simd
