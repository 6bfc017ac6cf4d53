// radixlm's vector layer, AVX512 (F, DQ, BW, VL, VNNI) form: 16 float32 / int32 lanes in one register.
// Included by cpu_isa.h inside `namespace radixlm_avx512` under `#pragma GCC target`; the kernel bodies
// (cpu_*_body.h) are written once against this layer's names. Every operation gives bit for bit what
// the AVX2 and portable layers give (same rounding, same reduction trees): see cpu_vec_portable.h.

constexpr int kIsa = 2;
constexpr int kMaxRows = 8;  // rows of x a matmul tile keeps in registers (32 zmm registers)
constexpr bool kPairDot = true;  // idot_pairs is one instruction (vpdpwssd)
constexpr int kValueRows = 4, kValueChunks = 4;  // attention: rows x 16-dim chunks of V accumulated at once

struct F16 { __m512 v; };   // 16 float32 lanes
struct I16 { __m512i v; };  // 16 int32 lanes

inline F16 fzero() { return {_mm512_setzero_ps()}; }
inline F16 fset1(float x) { return {_mm512_set1_ps(x)}; }
inline F16 fload(const float* p) { return {_mm512_loadu_ps(p)}; }
inline F16 fload(const at::BFloat16* p) {
  const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return {_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(v), 16))};
}
inline F16 fload(const at::Half* p) { return {_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)))}; }
inline __mmask16 first_n(int64_t n) { return n >= 16 ? 0xFFFF : n <= 0 ? 0 : static_cast<__mmask16>((1u << n) - 1); }
inline F16 fload_n(const float* p, int64_t n) { return {_mm512_maskz_loadu_ps(first_n(n), p)}; }
inline void fstore(float* p, F16 a) { _mm512_storeu_ps(p, a.v); }
inline __m512i bf16_bits(__m512 v) {  // round to nearest even as c10 does; NaN stays a quiet NaN
  const __m512i bits = _mm512_castps_si512(v);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_add_epi32(bits, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7FFF)));
  r = _mm512_srli_epi32(r, 16);
  return _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), _mm512_set1_epi32(0x7FC0));
}
inline void fstore(at::BFloat16* p, F16 a) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(bf16_bits(a.v)));
}
inline void fstore_n(float* p, F16 a, int64_t n) { _mm512_mask_storeu_ps(p, first_n(n), a.v); }
// 16 values in this layer's own lane order, for element-wise work only (no lane meets another between the load
// and the store): fstore_unordered puts back where fload_unordered took. Here the order is fload's.
template <typename T>
inline F16 fload_unordered(const T* p) { return fload(p); }
template <typename T>
inline void fstore_unordered(T* p, F16 a) { fstore(p, a); }
inline F16 round_bf16(F16 a) { return {_mm512_castsi512_ps(_mm512_slli_epi32(bf16_bits(a.v), 16))}; }

inline F16 add(F16 a, F16 b) { return {_mm512_add_ps(a.v, b.v)}; }
inline F16 sub(F16 a, F16 b) { return {_mm512_sub_ps(a.v, b.v)}; }
inline F16 mul(F16 a, F16 b) { return {_mm512_mul_ps(a.v, b.v)}; }
inline F16 div(F16 a, F16 b) { return {_mm512_div_ps(a.v, b.v)}; }
inline F16 fmadd(F16 a, F16 b, F16 c) { return {_mm512_fmadd_ps(a.v, b.v, c.v)}; }  // a b + c, one rounding
inline F16 fmax(F16 a, F16 b) { return {_mm512_max_ps(a.v, b.v)}; }
inline F16 fabs(F16 a) { return {_mm512_abs_ps(a.v)}; }
inline F16 keep_first(F16 a, int64_t n) { return {_mm512_maskz_mov_ps(first_n(n), a.v)}; }  // lanes >= n: 0
// lanes whose bit is set in `bits` become x
inline F16 select_bits(F16 a, uint32_t bits, float x) {
  return {_mm512_mask_mov_ps(a.v, static_cast<__mmask16>(bits), _mm512_set1_ps(x))};
}

// sum of the 16 lanes as ((x_i + x_{i+8}) + (.. + x_{i+4})) + ... : the tree every layer uses
inline float reduce_add(F16 a) {
  const __m256 s8 = _mm256_add_ps(_mm512_castps512_ps256(a.v), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a.v), 1)));
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
}
inline float reduce_max(F16 a) { return _mm512_reduce_max_ps(a.v); }
// the sums of four vectors at once: out[j] = ((v_0 + v_2) + (v_1 + v_3)) of a_j, where v_L is the sum of
// 128-bit lane L as (x_0 + x_2) + (x_1 + x_3)
inline void reduce4(F16 a0, F16 a1, F16 a2, F16 a3, float* out) {
  const __m512 s01 = _mm512_add_ps(_mm512_unpacklo_ps(a0.v, a1.v), _mm512_unpackhi_ps(a0.v, a1.v));
  const __m512 s23 = _mm512_add_ps(_mm512_unpacklo_ps(a2.v, a3.v), _mm512_unpackhi_ps(a2.v, a3.v));
  const __m512 v = _mm512_add_ps(_mm512_shuffle_ps(s01, s23, _MM_SHUFFLE(1, 0, 1, 0)),
                                 _mm512_shuffle_ps(s01, s23, _MM_SHUFFLE(3, 2, 3, 2)));
  const __m512 w = _mm512_add_ps(v, _mm512_shuffle_f32x4(v, v, _MM_SHUFFLE(1, 0, 3, 2)));
  _mm_storeu_ps(out, _mm512_castps512_ps128(_mm512_add_ps(w, _mm512_shuffle_f32x4(w, w, _MM_SHUFFLE(2, 3, 0, 1)))));
}

// exp(x), Cephes' expf polynomial (~1 ulp), x clamped to [-87, 88.75] (88.75 gives +inf)
inline F16 fexp(F16 a) {
  const __m512 x = _mm512_min_ps(_mm512_max_ps(a.v, _mm512_set1_ps(-87.f)), _mm512_set1_ps(88.75f));
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
  return {_mm512_scalef_ps(p, n)};
}

inline I16 izero() { return {_mm512_setzero_si512()}; }
inline F16 to_float(I16 a) { return {_mm512_cvtepi32_ps(a.v)}; }
inline I16 round_to_int(F16 a) { return {_mm512_cvtps_epi32(a.v)}; }  // nearest even
inline int32_t isum(I16 a) { return _mm512_reduce_add_epi32(a.v); }
inline void store_int8(int8_t* p, I16 a) {  // saturating
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm512_cvtsepi32_epi8(a.v));
}

inline int32_t four_bytes(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
// The 16 int4 codes of one k-quad of a weight tile (32 bytes: rows 0-7 in the low nibbles, 8-15 in the
// high), one byte each: lane j (4 bytes) is row j's 4 consecutive k.
inline __m512i int4_quad(const uint8_t* p) {
  const __m256i packed = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  const __m512i both = _mm512_inserti64x4(_mm512_castsi256_si512(packed), _mm256_srli_epi16(packed, 4), 1);
  return _mm512_and_si512(both, _mm512_set1_epi8(0x0F));
}
// ip[i]_j = sum over Quads k-quads of Bytes bytes each of w[j][k] x_i[k], x_i = x + i k_stride, where decode(quad)
// gives a k-quad's 64 unsigned codes as bytes (VNNI); the decoder may hold state (a table), dot_codes takes a plain
// function
template <int MT, int Quads, int Bytes, typename Decode>
inline void dot_decoded(const uint8_t* codes, const int8_t* x, int64_t k_stride, I16* ip, const Decode& decode) {
  for (int i = 0; i < MT; ++i) ip[i] = izero();
#pragma GCC unroll 8
  for (int kq = 0; kq < Quads; ++kq) {
    const __m512i wq = decode(codes + Bytes * kq);
    for (int i = 0; i < MT; ++i) {
      ip[i].v = _mm512_dpbusd_epi32(ip[i].v, wq, _mm512_set1_epi32(four_bytes(x + i * k_stride + 4 * kq)));
    }
  }
}
using QuadDecoder = __m512i (*)(const uint8_t*);
template <int MT, int Quads, int Bytes, QuadDecoder decode>
inline void dot_codes(const uint8_t* codes, const int8_t* x, int64_t k_stride, I16* ip) {
  dot_decoded<MT, Quads, Bytes>(codes, x, k_stride, ip, [](const uint8_t* p) { return decode(p); });
}
// one group of 32 k (8 k-quads of 32 bytes)
template <int MT>
inline void dot_int4_group(const uint8_t* codes, const int8_t* x, int64_t k_stride, I16* ip) {
  dot_codes<MT, 8, 32, int4_quad>(codes, x, k_stride, ip);
}
// codes plus `value` where a k-quad's bit plane (8 bytes at plane, bit l for lane l) is set
inline __m512i add_bit_plane(__m512i codes, const uint8_t* plane, char value) {
  uint64_t bits;
  std::memcpy(&bits, plane, 8);
  return _mm512_or_si512(codes, _mm512_maskz_mov_epi8(bits, _mm512_set1_epi8(value)));
}
// int5: a k-quad's nibbles as int4_quad's, plus 16 where its fifth bit (bytes 32-39) is set
inline __m512i int5_quad(const uint8_t* quad) { return add_bit_plane(int4_quad(quad), quad + 32, 16); }
// one group of 32 k (8 k-quads of 40 bytes)
template <int MT>
inline void dot_int5_group(const uint8_t* codes, const int8_t* x, int64_t k_stride, I16* ip) {
  dot_codes<MT, 8, 40, int5_quad>(codes, x, k_stride, ip);
}
// int6: a k-quad's nibbles as int4_quad's, plus its high bits (bytes 32-47: lane l's two at bits 2 (l / 16) of
// byte l % 16) at bits 4-5; 128-bit lane j of the broadcast holds lanes 16 j.. so shifts by 4, 2, 0, -2 bring
// them there (within each byte: 32-bit shifts move no bits 4-5 across bytes)
inline __m512i int6_quad(const uint8_t* p) {
  const __m512i high = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 32)));
  const __m512i up = _mm512_sllv_epi32(high, _mm512_setr_epi32(4, 4, 4, 4, 2, 2, 2, 2, 0, 0, 0, 0, 0, 0, 0, 0));
  const __m512i down = _mm512_srlv_epi32(up, _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2, 2, 2, 2));
  return _mm512_or_si512(int4_quad(p), _mm512_and_si512(down, _mm512_set1_epi8(0x30)));
}
// one sub-block of 16 k (4 k-quads of 48 bytes)
template <int MT>
inline void dot_int6_sub(const uint8_t* codes, const int8_t* x, int64_t k_stride, I16* ip) {
  dot_codes<MT, 4, sub_quad_bytes(6), int6_quad>(codes, x, k_stride, ip);
}
// int2 (GGUF's Q2_K): a k-quad's two bits (bytes 0-15: lane l's at bits 2 (l / 16) of byte l % 16, as int6's high
// bits); 128-bit lane j of the broadcast shifts right by 2 j
inline __m512i int2_quad(const uint8_t* p) {
  const __m512i pairs = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  const __m512i down = _mm512_srlv_epi32(pairs, _mm512_setr_epi32(0, 0, 0, 0, 2, 2, 2, 2, 4, 4, 4, 4, 6, 6, 6, 6));
  return _mm512_and_si512(down, _mm512_set1_epi8(3));
}
// int3: int2's bits plus 4 where the third bit (bytes 16-23, bit l for lane l) is set
inline __m512i int3_quad(const uint8_t* p) { return add_bit_plane(int2_quad(p), p + 16, 4); }
// one sub-block of 16 k (4 k-quads of 16 bytes)
template <int MT>
inline void dot_int2_sub(const uint8_t* codes, const int8_t* x, int64_t k_stride, I16* ip) {
  dot_codes<MT, 4, sub_quad_bytes(2), int2_quad>(codes, x, k_stride, ip);
}
// one sub-block of 16 k (4 k-quads of 24 bytes)
template <int MT>
inline void dot_int3_sub(const uint8_t* codes, const int8_t* x, int64_t k_stride, I16* ip) {
  dot_codes<MT, 4, sub_quad_bytes(3), int3_quad>(codes, x, k_stride, ip);
}
// The IQ4 layout's values biased by 128 (vpdpbusd multiplies unsigned bytes): the tile subtracts kIq4Bias sum(x)
// per group
constexpr int32_t kIq4Bias = 128;
// Quads k-quads of int4's 32 bytes, the codes indices into 16 unsigned byte values
template <int MT, int Quads>
inline void dot_table(const uint8_t* codes, const int8_t* x, int64_t k_stride, const Iq4Table& values, I16* ip) {
  const __m512i table = _mm512_broadcast_i32x4(_mm_load_si128(reinterpret_cast<const __m128i*>(values.v)));
  dot_decoded<MT, Quads, 32>(codes, x, k_stride, ip,
                             [table](const uint8_t* p) { return _mm512_shuffle_epi8(table, int4_quad(p)); });
}
// one group of 32 k (the values biased by kIq4Bias)
template <int MT>
inline void dot_iq4_group(const uint8_t* codes, const int8_t* x, int64_t k_stride, const Iq4Table& values, I16* ip) {
  dot_table<MT, 8>(codes, x, k_stride, values, ip);
}
constexpr bool kUnsignedTables = false;  // dot_iq4_group is dot_table already
inline I16 widen_int8(const int8_t* p) { return {_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)))}; }
inline I16 imadd(I16 a, I16 b, I16 c) { return {_mm512_add_epi32(_mm512_mullo_epi32(a.v, b.v), c.v)}; }  // a b + c
// lane l: the int16 pair (c a[l], c b[l]) (c a, c b within int16)
inline I16 widen_pairs(const int8_t* a, const int8_t* b, int16_t c) {
  const __m128i va = _mm_loadu_si128(reinterpret_cast<const __m128i*>(a));
  const __m128i vb = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b));
  const __m256i ab =  // a0 b0 .. a15 b15
      _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_unpacklo_epi8(va, vb)), _mm_unpackhi_epi8(va, vb), 1);
  return {_mm512_mullo_epi16(_mm512_cvtepi8_epi16(ab), _mm512_set1_epi16(c))};
}
// acc + w.lo x.lo + w.hi x.hi per lane, w's lanes and x int16 pairs (exact: the caller keeps it within int32)
inline I16 idot_pairs(I16 w, int32_t x, I16 acc) { return {_mm512_dpwssd_epi32(acc.v, w.v, _mm512_set1_epi32(x))}; }
// ip[i]_j = sum over one group of 32 k (8 k-quads of 16 rows x 4 int8) of (w[j][k] + kInt8Bias) x_i[k]: VNNI
// multiplies unsigned by signed bytes, so w is biased by 128; the kernel subtracts kInt8Bias sum(x) per group
constexpr int32_t kInt8Bias = 128;
template <int MT>
inline void dot_int8_group(const int8_t* q, const int8_t* x, int64_t k_stride, I16* ip) {
  for (int i = 0; i < MT; ++i) ip[i] = izero();
  for (int kq = 0; kq < 8; ++kq) {
    const __m512i biased = _mm512_xor_si512(_mm512_loadu_si512(q + 64 * kq), _mm512_set1_epi8(static_cast<char>(0x80)));
    for (int i = 0; i < MT; ++i) {
      ip[i].v = _mm512_dpbusd_epi32(ip[i].v, biased, _mm512_set1_epi32(four_bytes(x + i * k_stride + 4 * kq)));
    }
  }
}
inline I16 isub_scalar(I16 a, int32_t x) { return {_mm512_sub_epi32(a.v, _mm512_set1_epi32(x))}; }

inline void prefetch(const void* p) { _mm_prefetch(static_cast<const char*>(p), _MM_HINT_T0); }
// a line read once and not again soon: fetched without displacing the outer caches' lines (non-temporal)
inline void prefetch_once(const void* p) { _mm_prefetch(static_cast<const char*>(p), _MM_HINT_NTA); }
