// radixlm's vector layer, AVX2 + FMA + F16C form: 16 lanes as two 256-bit halves (lanes 0-7, 8-15).
// Included by cpu_isa.h inside `namespace radixlm_avx2` under `#pragma GCC target`. Same names and the
// same results, bit for bit, as the AVX512 and portable layers (see cpu_vec_portable.h for the reference
// semantics). int8 dot products are maddubs + madd, as ggml does; compiled with RADIXLM_DPBUSD256 (the
// AVX2 + VNNI path, cpu_foreach_isa.h) the matmuls' dot products are that 256-bit vpdpbusd instead.

#ifdef RADIXLM_DPBUSD256
constexpr int kIsa = 5;
#else
constexpr int kIsa = 1;
#endif
constexpr int kMaxRows = 4;  // rows of x a matmul tile keeps in registers (16 ymm registers)
#ifdef RADIXLM_DPWSSD256
constexpr bool kPairDot = true;  // idot_pairs is one instruction (vpdpwssd) a half
#else
constexpr bool kPairDot = false;
#endif
constexpr int kValueRows = 3, kValueChunks = 2;  // attention: rows x 16-dim chunks of V accumulated at once

struct F16 { __m256 lo, hi; };
struct I16 { __m256i lo, hi; };

inline F16 fzero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
inline F16 fset1(float x) { return {_mm256_set1_ps(x), _mm256_set1_ps(x)}; }
inline F16 fload(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
inline __m256 widen_bf16(__m128i v) { return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(v), 16)); }
inline F16 fload(const at::BFloat16* p) {
  const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return {widen_bf16(_mm256_castsi256_si128(v)), widen_bf16(_mm256_extracti128_si256(v, 1))};
}
inline F16 fload(const at::Half* p) {
  const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return {_mm256_cvtph_ps(_mm256_castsi256_si128(v)), _mm256_cvtph_ps(_mm256_extracti128_si256(v, 1))};
}
inline __m256i lanes_below(int64_t n) {  // lane i set where i < n
  const int32_t k = static_cast<int32_t>(n < 0 ? 0 : n > 8 ? 8 : n);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(k), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
inline F16 fload_n(const float* p, int64_t n) {
  return {_mm256_maskload_ps(p, lanes_below(n)), n > 8 ? _mm256_maskload_ps(p + 8, lanes_below(n - 8)) : _mm256_setzero_ps()};
}
inline void fstore(float* p, F16 a) {
  _mm256_storeu_ps(p, a.lo);
  _mm256_storeu_ps(p + 8, a.hi);
}
inline __m256i bf16_bits(__m256 v) {  // round to nearest even as c10 does; NaN stays a quiet NaN
  const __m256i bits = _mm256_castps_si256(v);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  const __m256i r = _mm256_srli_epi32(_mm256_add_epi32(bits, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7FFF))), 16);
  return _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7FC0), _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)));
}
inline void fstore(at::BFloat16* p, F16 a) {
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(bf16_bits(a.lo), bf16_bits(a.hi)), 0xD8);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), packed);
}
inline void fstore_n(float* p, F16 a, int64_t n) {
  _mm256_maskstore_ps(p, lanes_below(n), a.lo);
  if (n > 8) _mm256_maskstore_ps(p + 8, lanes_below(n - 8), a.hi);
}
// 16 values in this layer's own lane order, for element-wise work only (no lane meets another between the load
// and the store): fstore_unordered puts back where fload_unordered took. bfloat16 goes even elements to lo, odd
// ones to hi (a shift and a mask, no widening shuffle); float32 and float16 keep fload's order.
template <typename T>
inline F16 fload_unordered(const T* p) { return fload(p); }
template <typename T>
inline void fstore_unordered(T* p, F16 a) { fstore(p, a); }
template <>
inline F16 fload_unordered(const at::BFloat16* p) {
  const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return {_mm256_castsi256_ps(_mm256_slli_epi32(v, 16)),
          _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32(static_cast<int32_t>(0xFFFF0000u))))};
}
template <>
inline void fstore_unordered(at::BFloat16* p, F16 a) {
  const __m256i pairs = _mm256_or_si256(bf16_bits(a.lo), _mm256_slli_epi32(bf16_bits(a.hi), 16));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), pairs);
}
inline F16 round_bf16(F16 a) {
  return {_mm256_castsi256_ps(_mm256_slli_epi32(bf16_bits(a.lo), 16)),
          _mm256_castsi256_ps(_mm256_slli_epi32(bf16_bits(a.hi), 16))};
}

inline F16 add(F16 a, F16 b) { return {_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)}; }
inline F16 sub(F16 a, F16 b) { return {_mm256_sub_ps(a.lo, b.lo), _mm256_sub_ps(a.hi, b.hi)}; }
inline F16 mul(F16 a, F16 b) { return {_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)}; }
inline F16 div(F16 a, F16 b) { return {_mm256_div_ps(a.lo, b.lo), _mm256_div_ps(a.hi, b.hi)}; }
inline F16 fmadd(F16 a, F16 b, F16 c) { return {_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)}; }
inline F16 fmax(F16 a, F16 b) { return {_mm256_max_ps(a.lo, b.lo), _mm256_max_ps(a.hi, b.hi)}; }
inline F16 fabs(F16 a) {
  const __m256 m = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  return {_mm256_and_ps(a.lo, m), _mm256_and_ps(a.hi, m)};
}
inline F16 keep_first(F16 a, int64_t n) {
  return {_mm256_and_ps(a.lo, _mm256_castsi256_ps(lanes_below(n))), _mm256_and_ps(a.hi, _mm256_castsi256_ps(lanes_below(n - 8)))};
}
inline __m256 bits_mask(uint32_t bits) {  // lane i set where bit i of bits is
  const __m256i b = _mm256_and_si256(_mm256_set1_epi32(static_cast<int32_t>(bits)), _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128));
  return _mm256_castsi256_ps(_mm256_cmpgt_epi32(b, _mm256_setzero_si256()));
}
inline F16 select_bits(F16 a, uint32_t bits, float x) {
  const __m256 v = _mm256_set1_ps(x);
  return {_mm256_blendv_ps(a.lo, v, bits_mask(bits & 0xFF)), _mm256_blendv_ps(a.hi, v, bits_mask((bits >> 8) & 0xFF))};
}

inline float reduce_add(F16 a) {
  const __m256 s8 = _mm256_add_ps(a.lo, a.hi);
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
}
inline float reduce_max(F16 a) {
  const __m256 m8 = _mm256_max_ps(a.lo, a.hi);
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(m8), _mm256_extractf128_ps(m8, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}
inline void reduce4(F16 a0, F16 a1, F16 a2, F16 a3, float* out) {
  auto lanes = [](__m256 x0, __m256 x1, __m256 x2, __m256 x3) {  // v per 128-bit lane, as in the AVX512 layer
    const __m256 s01 = _mm256_add_ps(_mm256_unpacklo_ps(x0, x1), _mm256_unpackhi_ps(x0, x1));
    const __m256 s23 = _mm256_add_ps(_mm256_unpacklo_ps(x2, x3), _mm256_unpackhi_ps(x2, x3));
    return _mm256_add_ps(_mm256_shuffle_ps(s01, s23, _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm256_shuffle_ps(s01, s23, _MM_SHUFFLE(3, 2, 3, 2)));
  };
  const __m256 w = _mm256_add_ps(lanes(a0.lo, a1.lo, a2.lo, a3.lo), lanes(a0.hi, a1.hi, a2.hi, a3.hi));
  _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(w), _mm256_extractf128_ps(w, 1)));
}

inline __m256 pow2(__m256i n) { return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n, _mm256_set1_epi32(127)), 23)); }
// p 2^n as two exact power-of-two products (n in [-126, 128]), rounded once like AVX512's scalef
inline __m256 scale2(__m256 p, __m256 n) {
  const __m256i ni = _mm256_cvtps_epi32(n), half = _mm256_srai_epi32(ni, 1);
  return _mm256_mul_ps(_mm256_mul_ps(p, pow2(half)), pow2(_mm256_sub_epi32(ni, half)));
}
inline __m256 exp8(__m256 a) {
  const __m256 x = _mm256_min_ps(_mm256_max_ps(a, _mm256_set1_ps(-87.f)), _mm256_set1_ps(88.75f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.f)));
  return scale2(p, n);
}
inline F16 fexp(F16 a) { return {exp8(a.lo), exp8(a.hi)}; }

inline I16 izero() { return {_mm256_setzero_si256(), _mm256_setzero_si256()}; }
inline F16 to_float(I16 a) { return {_mm256_cvtepi32_ps(a.lo), _mm256_cvtepi32_ps(a.hi)}; }
inline I16 round_to_int(F16 a) { return {_mm256_cvtps_epi32(a.lo), _mm256_cvtps_epi32(a.hi)}; }
inline int32_t isum(I16 a) {
  const __m256i s8 = _mm256_add_epi32(a.lo, a.hi);
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(s8), _mm256_extracti128_si256(s8, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
  return _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1))));
}
inline void store_int8(int8_t* p, I16 a) {  // saturating
  const __m256i w16 = _mm256_permute4x64_epi64(_mm256_packs_epi32(a.lo, a.hi), 0xD8);  // 16 int16 in order
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm_packs_epi16(_mm256_castsi256_si128(w16), _mm256_extracti128_si256(w16, 1)));
}

inline int32_t four_bytes(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
// The int4 dot product's accumulator per k-quad: with VNNI vpdpbusd adds four unsigned code x signed byte
// products into each int32 lane exactly; without, maddubs' int16 pairs (at most 2 * 15 * 127) summed over a
// group's 8 k-quads (30,480) stay in int16, and one maddwd per group (acc_int32) widens them.
#ifdef RADIXLM_DPBUSD256
inline __m256i acc_codes(__m256i acc, __m256i codes, __m256i xb) { return RADIXLM_DPBUSD256(acc, codes, xb); }
inline __m256i acc_int32(__m256i acc) { return acc; }
#else
inline __m256i sum4(__m256i pairs16) { return _mm256_madd_epi16(pairs16, _mm256_set1_epi16(1)); }
inline __m256i acc_codes(__m256i acc, __m256i codes, __m256i xb) {
  return _mm256_add_epi16(acc, _mm256_maddubs_epi16(codes, xb));
}
inline __m256i acc_int32(__m256i acc) { return sum4(acc); }
#endif
// ip[i]_j = sum over Quads k-quads of Bytes bytes each of w[j][k] x_i[k], x_i = x + i k_stride, where
// decode(quad, &c_lo, &c_hi) gives a k-quad's 64 unsigned codes as bytes (lanes 0-31, 32-63). The int16 sums
// (maddubs' pairs) run over Run k-quads before acc_int32 widens them: Run * 2 * max code * 127 < 32,768. The decoder
// may hold state (a table); dot_codes takes a plain function.
template <int MT, int Quads, int Run, int Bytes, typename Decode>
inline void dot_decoded(const uint8_t* codes, const int8_t* x, int64_t k_stride, I16* ip, const Decode& decode) {
  for (int i = 0; i < MT; ++i) ip[i] = izero();
  for (int run = 0; run < Quads / Run; ++run) {
    __m256i lo[MT], hi[MT];
    for (int i = 0; i < MT; ++i) lo[i] = hi[i] = _mm256_setzero_si256();
#pragma GCC unroll 8
    for (int kq = Run * run; kq < Run * run + Run; ++kq) {
      __m256i c_lo, c_hi;
      decode(codes + Bytes * kq, &c_lo, &c_hi);
      for (int i = 0; i < MT; ++i) {
        const __m256i xb = _mm256_set1_epi32(four_bytes(x + i * k_stride + 4 * kq));
        lo[i] = acc_codes(lo[i], c_lo, xb);
        hi[i] = acc_codes(hi[i], c_hi, xb);
      }
    }
    for (int i = 0; i < MT; ++i) {
      ip[i].lo = _mm256_add_epi32(ip[i].lo, acc_int32(lo[i]));
      ip[i].hi = _mm256_add_epi32(ip[i].hi, acc_int32(hi[i]));
    }
  }
}
using QuadDecoder = void (*)(const uint8_t*, __m256i*, __m256i*);
template <int MT, int Quads, int Run, int Bytes, QuadDecoder decode>
inline void dot_codes(const uint8_t* codes, const int8_t* x, int64_t k_stride, I16* ip) {
  dot_decoded<MT, Quads, Run, Bytes>(codes, x, k_stride, ip,
                                     [](const uint8_t* quad, __m256i* lo, __m256i* hi) { decode(quad, lo, hi); });
}
// a k-quad's int4 codes: bytes 0-31 hold lanes 0-31 in their low nibbles, lanes 32-63 in their high ones
inline void int4_quad(const uint8_t* quad, __m256i* c_lo, __m256i* c_hi) {
  const __m256i packed = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(quad)), low = _mm256_set1_epi8(0x0F);
  *c_lo = _mm256_and_si256(packed, low);
  *c_hi = _mm256_and_si256(_mm256_srli_epi16(packed, 4), low);
}
// one group of 32 k (8 k-quads of 32 bytes); codes up to 15: int16 sums over all 8 (30,480)
template <int MT>
inline void dot_int4_group(const uint8_t* codes, const int8_t* x, int64_t k_stride, I16* ip) {
  dot_codes<MT, 8, 8, 32, int4_quad>(codes, x, k_stride, ip);
}
// `value` in byte l of 32 where bit l of `bits` is set, else 0
inline __m256i bit_lanes(uint32_t bits, char value) {
  const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int32_t>(bits)),
                                             _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                                              2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
  const __m256i bit = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ULL));
  return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit), _mm256_set1_epi8(value));
}
// codes plus `value` where a k-quad's bit plane (8 bytes at plane, bit l for lane l: lanes 0-31, then 32-63) is set
inline void add_bit_plane(const uint8_t* plane, char value, __m256i* c_lo, __m256i* c_hi) {
  uint32_t b0, b1;
  std::memcpy(&b0, plane, 4);
  std::memcpy(&b1, plane + 4, 4);
  *c_lo = _mm256_or_si256(*c_lo, bit_lanes(b0, value));
  *c_hi = _mm256_or_si256(*c_hi, bit_lanes(b1, value));
}
// int5: the int4 codes plus 16 where the k-quad's fifth bit is set (bytes 32-35: rows 0-7, 36-39: rows 8-15)
inline void int5_quad(const uint8_t* quad, __m256i* c_lo, __m256i* c_hi) {
  int4_quad(quad, c_lo, c_hi);
  add_bit_plane(quad + 32, 16, c_lo, c_hi);
}
// one group of 32 k (8 k-quads of 40 bytes); codes up to 31: int16 sums over 4 k-quads (31,496)
template <int MT>
inline void dot_int5_group(const uint8_t* codes, const int8_t* x, int64_t k_stride, I16* ip) {
  dot_codes<MT, 8, 4, 40, int5_quad>(codes, x, k_stride, ip);
}
// int6: the int4 codes plus the high bits at bits 4-5 (bytes 32-47 of a k-quad: lane l's two at bits 2 (l / 16) of
// byte l % 16): lanes 0-31 from bits 0-1 / 2-3 (shift left 4 / 2), lanes 32-63 from bits 4-5 / 6-7 (0 / right
// 2), each within its byte
inline void int6_quad(const uint8_t* quad, __m256i* c_lo, __m256i* c_hi) {
  const __m256i high = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(quad + 32)));
  const __m256i mask = _mm256_set1_epi8(0x30);
  const __m256i up = _mm256_sllv_epi32(high, _mm256_setr_epi32(4, 4, 4, 4, 2, 2, 2, 2));
  const __m256i down = _mm256_srlv_epi32(high, _mm256_setr_epi32(0, 0, 0, 0, 2, 2, 2, 2));
  int4_quad(quad, c_lo, c_hi);
  *c_lo = _mm256_or_si256(*c_lo, _mm256_and_si256(up, mask));
  *c_hi = _mm256_or_si256(*c_hi, _mm256_and_si256(down, mask));
}
// one sub-block of 16 k (4 k-quads of 48 bytes); codes up to 63: int16 sums over 2 k-quads (32,004)
template <int MT>
inline void dot_int6_sub(const uint8_t* codes, const int8_t* x, int64_t k_stride, I16* ip) {
  dot_codes<MT, 4, 2, sub_quad_bytes(6), int6_quad>(codes, x, k_stride, ip);
}
// int2 (GGUF's Q2_K): a k-quad's two bits (bytes 0-15: lane l's at bits 2 (l / 16) of byte l % 16, as int6's high
// bits): lanes 0-31 from bits 0-1 / 2-3, lanes 32-63 from bits 4-5 / 6-7 (right shifts within each 32-bit word)
inline void int2_quad(const uint8_t* quad, __m256i* c_lo, __m256i* c_hi) {
  const __m256i pairs = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(quad)));
  const __m256i mask = _mm256_set1_epi8(3);
  *c_lo = _mm256_and_si256(_mm256_srlv_epi32(pairs, _mm256_setr_epi32(0, 0, 0, 0, 2, 2, 2, 2)), mask);
  *c_hi = _mm256_and_si256(_mm256_srlv_epi32(pairs, _mm256_setr_epi32(4, 4, 4, 4, 6, 6, 6, 6)), mask);
}
// int3: int2's bits plus 4 where the third bit (bytes 16-19: lanes 0-31, 20-23: lanes 32-63) is set
inline void int3_quad(const uint8_t* quad, __m256i* c_lo, __m256i* c_hi) {
  int2_quad(quad, c_lo, c_hi);
  add_bit_plane(quad + 16, 4, c_lo, c_hi);
}
// one sub-block of 16 k (4 k-quads of 16 bytes); codes up to 3
template <int MT>
inline void dot_int2_sub(const uint8_t* codes, const int8_t* x, int64_t k_stride, I16* ip) {
  dot_codes<MT, 4, 4, sub_quad_bytes(2), int2_quad>(codes, x, k_stride, ip);
}
// one sub-block of 16 k (4 k-quads of 24 bytes); codes up to 7: int16 sums over all 4 (7,112)
template <int MT>
inline void dot_int3_sub(const uint8_t* codes, const int8_t* x, int64_t k_stride, I16* ip) {
  dot_codes<MT, 4, 4, sub_quad_bytes(3), int3_quad>(codes, x, k_stride, ip);
}
inline I16 widen_int8(const int8_t* p) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return {_mm256_cvtepi8_epi32(v), _mm256_cvtepi8_epi32(_mm_srli_si128(v, 8))};
}
inline I16 imadd(I16 a, I16 b, I16 c) {  // a b + c
  return {_mm256_add_epi32(_mm256_mullo_epi32(a.lo, b.lo), c.lo), _mm256_add_epi32(_mm256_mullo_epi32(a.hi, b.hi), c.hi)};
}
// lane l: the int16 pair (c a[l], c b[l]) (c a, c b within int16)
inline I16 widen_pairs(const int8_t* a, const int8_t* b, int16_t c) {
  const __m128i va = _mm_loadu_si128(reinterpret_cast<const __m128i*>(a));
  const __m128i vb = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b));
  const __m256i vc = _mm256_set1_epi16(c);
  return {_mm256_mullo_epi16(_mm256_cvtepi8_epi16(_mm_unpacklo_epi8(va, vb)), vc),
          _mm256_mullo_epi16(_mm256_cvtepi8_epi16(_mm_unpackhi_epi8(va, vb)), vc)};
}
// acc + w.lo x.lo + w.hi x.hi per lane, w's lanes and x int16 pairs (exact: the caller keeps it within int32)
inline I16 idot_pairs(I16 w, int32_t x, I16 acc) {
  const __m256i xv = _mm256_set1_epi32(x);
#ifdef RADIXLM_DPWSSD256
  return {RADIXLM_DPWSSD256(acc.lo, w.lo, xv), RADIXLM_DPWSSD256(acc.hi, w.hi, xv)};
#else
  return {_mm256_add_epi32(acc.lo, _mm256_madd_epi16(w.lo, xv)), _mm256_add_epi32(acc.hi, _mm256_madd_epi16(w.hi, xv))};
#endif
}
// The int8-valued weights, int8 (a k-quad's 64 bytes: rows 0-7, then 8-15) and IQ4 (int4 codes looked up in the
// layout's 16 values); a decoder gives a k-quad's 64 values as int4_quad gives codes.
#ifdef RADIXLM_DPBUSD256
// VNNI multiplies unsigned by signed bytes: the values come biased by 128, and the tile subtracts 128 sum(x) per group
constexpr int32_t kInt8Bias = 128, kIq4Bias = 128;
constexpr int kTableRun = 4;  // the table form's k-quads a run (any: vpdpbusd sums in int32)
constexpr bool kUnsignedTables = false;  // the IQ4 layout's values go biased by 128 whatever their range
inline void int8_quad(const uint8_t* quad, __m256i* w_lo, __m256i* w_hi) {
  const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
  *w_lo = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(quad)), flip);
  *w_hi = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(quad + 32)), flip);
}
// ip[i]_j = sum over one group of 32 k (8 k-quads of Bytes bytes) of (w[j][k] + 128) x_i[k]
template <int MT, int Bytes, typename Decode>
inline void dot_values_group(const uint8_t* codes, const int8_t* x, int64_t k_stride, I16* ip, const Decode& decode) {
  dot_decoded<MT, 8, 8, Bytes>(codes, x, k_stride, ip, decode);
}
#else
// signed values in [-127, 127]: |w| times x with w's sign (maddubs pairs at most 2 * 127 * 127, a maddwd a k-quad)
constexpr int32_t kInt8Bias = 0, kIq4Bias = 0;
constexpr int kTableRun = 1;  // the table form's codes up to 127: maddubs pairs to 32,258
// an IQ4 table whose values lie in [-64, 63] goes plus 64 as unsigned codes (dot_table), which maddubs takes
// without the signed products' two sign operations
constexpr bool kUnsignedTables = true;
inline void int8_quad(const uint8_t* quad, __m256i* w_lo, __m256i* w_hi) {
  *w_lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(quad));
  *w_hi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(quad + 32));
}
// ip[i]_j = sum over one group of 32 k (8 k-quads of Bytes bytes) of w[j][k] x_i[k], exact
template <int MT, int Bytes, typename Decode>
inline void dot_values_group(const uint8_t* codes, const int8_t* x, int64_t k_stride, I16* ip, const Decode& decode) {
  for (int i = 0; i < MT; ++i) ip[i] = izero();
  for (int kq = 0; kq < 8; ++kq) {
    __m256i w0, w1;
    decode(codes + Bytes * kq, &w0, &w1);
    const __m256i a0 = _mm256_sign_epi8(w0, w0), a1 = _mm256_sign_epi8(w1, w1);
    for (int i = 0; i < MT; ++i) {
      const __m256i xb = _mm256_set1_epi32(four_bytes(x + i * k_stride + 4 * kq));
      ip[i].lo = _mm256_add_epi32(ip[i].lo, sum4(_mm256_maddubs_epi16(a0, _mm256_sign_epi8(xb, w0))));
      ip[i].hi = _mm256_add_epi32(ip[i].hi, sum4(_mm256_maddubs_epi16(a1, _mm256_sign_epi8(xb, w1))));
    }
  }
}
#endif
// one group of 32 k of int8 weights (8 k-quads of 16 rows x 4 int8), less the bias times sum(x) (kInt8Bias)
template <int MT>
inline void dot_int8_group(const int8_t* q, const int8_t* x, int64_t k_stride, I16* ip) {
  dot_values_group<MT, 64>(reinterpret_cast<const uint8_t*>(q), x, k_stride, ip,
                           [](const uint8_t* quad, __m256i* lo, __m256i* hi) { int8_quad(quad, lo, hi); });
}
// a decoder of a k-quad's int4 codes (int4's 32 bytes) into the 16 byte values they index
inline auto table_decoder(const Iq4Table& values) {
  const __m256i table = _mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(values.v)));
  return [table](const uint8_t* quad, __m256i* lo, __m256i* hi) {
    int4_quad(quad, lo, hi);
    *lo = _mm256_shuffle_epi8(table, *lo);
    *hi = _mm256_shuffle_epi8(table, *hi);
  };
}
// Quads k-quads of int4 codes into 16 unsigned values below 128 (a table in [-64, 63] plus 64)
template <int MT, int Quads>
inline void dot_table(const uint8_t* codes, const int8_t* x, int64_t k_stride, const Iq4Table& values, I16* ip) {
  dot_decoded<MT, Quads, kTableRun, 32>(codes, x, k_stride, ip, table_decoder(values));
}
// one group of 32 k of IQ4 codes (8 k-quads of int4's 32 bytes, indices into the 16 values, biased by kIq4Bias),
// less kIq4Bias sum(x)
template <int MT>
inline void dot_iq4_group(const uint8_t* codes, const int8_t* x, int64_t k_stride, const Iq4Table& values, I16* ip) {
  dot_values_group<MT, 32>(codes, x, k_stride, ip, table_decoder(values));
}
inline I16 isub_scalar(I16 a, int32_t x) {
  const __m256i v = _mm256_set1_epi32(x);
  return {_mm256_sub_epi32(a.lo, v), _mm256_sub_epi32(a.hi, v)};
}

inline void prefetch(const void* p) { _mm_prefetch(static_cast<const char*>(p), _MM_HINT_T0); }
// a line read once and not again soon: fetched without displacing the outer caches' lines (non-temporal)
inline void prefetch_once(const void* p) { _mm_prefetch(static_cast<const char*>(p), _MM_HINT_NTA); }
