// 16-lane float32 loads and stores shared by radixlm's C++ CPU kernels (AVX512F).
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

}  // namespace radixlm_simd
