// radixlm's vector layer, ARM NEON form (AArch64, with the dotprod extension): 16 lanes as four 128-bit
// quarters (lanes 0-3, 4-7, 8-11, 12-15). Included inside `namespace radixlm_neon` under
// `#pragma GCC target("arch=armv8.2-a+dotprod")`. Same names and the same results, bit for bit, as the
// portable layer (the reference semantics, see cpu_vec_portable.h): fused multiply-adds are vfma, float to
// int rounds to nearest even (vcvtn), reductions follow the portable trees. int8 dot products are sdot,
// as ggml's dotprod kernels do; they are exact, so any order gives the portable sums.

#include <arm_neon.h>

constexpr int kIsa = 4;
constexpr int kMaxRows = 4;  // rows of x a matmul tile keeps in registers (32 q registers, 4 per F16)
constexpr bool kPairDot = false;  // idot_pairs takes 4 operations a quarter: the matmuls skip the pair form
constexpr int kValueRows = 2, kValueChunks = 2;  // attention: rows x 16-dim chunks of V accumulated at once

struct F16 { float32x4_t q[4]; };
struct I16 { int32x4_t q[4]; };

#define RADIXLM_QUARTERS(expr) \
  F16 r;                       \
  for (int j = 0; j < 4; ++j) r.q[j] = (expr); \
  return r

inline F16 fzero() { RADIXLM_QUARTERS(vdupq_n_f32(0.f)); }
inline F16 fset1(float x) { RADIXLM_QUARTERS(vdupq_n_f32(x)); }
inline F16 fload(const float* p) { RADIXLM_QUARTERS(vld1q_f32(p + 4 * j)); }
inline F16 fload(const at::BFloat16* p) {
  const uint16_t* u = reinterpret_cast<const uint16_t*>(p);
  RADIXLM_QUARTERS(vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(u + 4 * j), 16)));
}
inline F16 fload(const at::Half* p) {
  const uint16_t* u = reinterpret_cast<const uint16_t*>(p);
  RADIXLM_QUARTERS(vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(u + 4 * j))));
}
inline uint32x4_t lanes_below(int64_t n, int j) {  // lane i of quarter j set where 4 j + i < n
  const int32_t k = static_cast<int32_t>(n < 0 ? 0 : n > 16 ? 16 : n);
  const int32_t idx[4] = {4 * j, 4 * j + 1, 4 * j + 2, 4 * j + 3};
  return vcltq_s32(vld1q_s32(idx), vdupq_n_s32(k));
}
inline F16 fload_n(const float* p, int64_t n) {
  F16 r;
  for (int j = 0; j < 4; ++j) {
    float part[4] = {0.f, 0.f, 0.f, 0.f};
    for (int i = 0; i < 4; ++i) part[i] = 4 * j + i < n ? p[4 * j + i] : 0.f;  // never reads past n
    r.q[j] = vld1q_f32(part);
  }
  return r;
}
inline void fstore(float* p, F16 a) {
  for (int j = 0; j < 4; ++j) vst1q_f32(p + 4 * j, a.q[j]);
}
inline uint32x4_t bf16_bits(float32x4_t v) {  // round to nearest even as c10 does; NaN stays a quiet NaN
  const uint32x4_t bits = vreinterpretq_u32_f32(v);
  const uint32x4_t odd = vandq_u32(vshrq_n_u32(bits, 16), vdupq_n_u32(1));
  const uint32x4_t r = vshrq_n_u32(vaddq_u32(bits, vaddq_u32(odd, vdupq_n_u32(0x7FFF))), 16);
  return vbslq_u32(vceqq_f32(v, v), r, vdupq_n_u32(0x7FC0));
}
inline void fstore(at::BFloat16* p, F16 a) {
  uint16_t* u = reinterpret_cast<uint16_t*>(p);
  for (int j = 0; j < 4; ++j) vst1_u16(u + 4 * j, vmovn_u32(bf16_bits(a.q[j])));
}
inline void fstore_n(float* p, F16 a, int64_t n) {
  float all[16];
  fstore(all, a);
  for (int i = 0; i < 16 && i < n; ++i) p[i] = all[i];
}
// 16 values in this layer's own lane order, for element-wise work only (no lane meets another between the load
// and the store): fstore_unordered puts back where fload_unordered took. Here the order is fload's.
template <typename T>
inline F16 fload_unordered(const T* p) { return fload(p); }
template <typename T>
inline void fstore_unordered(T* p, F16 a) { fstore(p, a); }
inline F16 round_bf16(F16 a) { RADIXLM_QUARTERS(vreinterpretq_f32_u32(vshlq_n_u32(bf16_bits(a.q[j]), 16))); }

inline F16 add(F16 a, F16 b) { RADIXLM_QUARTERS(vaddq_f32(a.q[j], b.q[j])); }
inline F16 sub(F16 a, F16 b) { RADIXLM_QUARTERS(vsubq_f32(a.q[j], b.q[j])); }
inline F16 mul(F16 a, F16 b) { RADIXLM_QUARTERS(vmulq_f32(a.q[j], b.q[j])); }
inline F16 div(F16 a, F16 b) { RADIXLM_QUARTERS(vdivq_f32(a.q[j], b.q[j])); }
inline F16 fmadd(F16 a, F16 b, F16 c) { RADIXLM_QUARTERS(vfmaq_f32(c.q[j], a.q[j], b.q[j])); }
// a > b ? a : b, so b when unordered (as x86's maxps and the portable layer), not NEON's NaN-propagating max
inline F16 fmax(F16 a, F16 b) { RADIXLM_QUARTERS(vbslq_f32(vcgtq_f32(a.q[j], b.q[j]), a.q[j], b.q[j])); }
inline F16 fabs(F16 a) { RADIXLM_QUARTERS(vabsq_f32(a.q[j])); }
inline F16 keep_first(F16 a, int64_t n) {
  RADIXLM_QUARTERS(vreinterpretq_f32_u32(vandq_u32(vreinterpretq_u32_f32(a.q[j]), lanes_below(n, j))));
}
inline F16 select_bits(F16 a, uint32_t bits, float x) {
  F16 r;
  for (int j = 0; j < 4; ++j) {
    const int32_t one[4] = {1, 2, 4, 8};
    const uint32x4_t b = vandq_u32(vdupq_n_u32((bits >> (4 * j)) & 0xF), vreinterpretq_u32_s32(vld1q_s32(one)));
    r.q[j] = vbslq_f32(vcgtq_u32(b, vdupq_n_u32(0)), vdupq_n_f32(x), a.q[j]);
  }
  return r;
}
#undef RADIXLM_QUARTERS

// s8_i = x_i + x_{i+8}; s4_i = s8_i + s8_{i+4}; (s4_0 + s4_2) + (s4_1 + s4_3), as the portable layer
inline float reduce_add(F16 a) {
  const float32x4_t s4 = vaddq_f32(vaddq_f32(a.q[0], a.q[2]), vaddq_f32(a.q[1], a.q[3]));
  const float32x4_t s2 = vaddq_f32(s4, vextq_f32(s4, s4, 2));  // s2_0 = s4_0 + s4_2, s2_1 = s4_1 + s4_3
  return vgetq_lane_f32(s2, 0) + vgetq_lane_f32(s2, 1);
}
inline float reduce_max(F16 a) {  // lane by lane, keeping the earlier lane unless a later one is greater
  float all[16];
  fstore(all, a);
  float m = all[0];
  for (int i = 1; i < 16; ++i) m = all[i] > m ? all[i] : m;
  return m;
}
// out_j = (v_0 + v_2) + (v_1 + v_3), v_L = (x_{4L} + x_{4L+2}) + (x_{4L+1} + x_{4L+3}) of vector a_j: the
// quarters of the four vectors transposed so that each sum runs over j in the lanes
inline void reduce4(F16 a0, F16 a1, F16 a2, F16 a3, float* out) {
  float32x4_t v[4];
  for (int l = 0; l < 4; ++l) {
    const float32x4_t t0 = vtrn1q_f32(a0.q[l], a1.q[l]), t1 = vtrn2q_f32(a0.q[l], a1.q[l]);
    const float32x4_t t2 = vtrn1q_f32(a2.q[l], a3.q[l]), t3 = vtrn2q_f32(a2.q[l], a3.q[l]);
    auto lo = [](float32x4_t x, float32x4_t y) {
      return vreinterpretq_f32_f64(vtrn1q_f64(vreinterpretq_f64_f32(x), vreinterpretq_f64_f32(y)));
    };
    auto hi = [](float32x4_t x, float32x4_t y) {
      return vreinterpretq_f32_f64(vtrn2q_f64(vreinterpretq_f64_f32(x), vreinterpretq_f64_f32(y)));
    };
    const float32x4_t c0 = lo(t0, t2), c1 = lo(t1, t3), c2 = hi(t0, t2), c3 = hi(t1, t3);  // c_i[j] = x_{4l+i}
    v[l] = vaddq_f32(vaddq_f32(c0, c2), vaddq_f32(c1, c3));
  }
  vst1q_f32(out, vaddq_f32(vaddq_f32(v[0], v[2]), vaddq_f32(v[1], v[3])));
}

inline float32x4_t pow2(int32x4_t n) {  // 2^n for n in [-126, 128] (128 is +inf)
  return vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(n, vdupq_n_s32(127)), 23));
}
inline float32x4_t exp4(float32x4_t a) {  // the portable exp1, four lanes at a time
  const float32x4_t x = vminnmq_f32(vmaxnmq_f32(a, vdupq_n_f32(-87.f)), vdupq_n_f32(88.75f));
  const float32x4_t n = vrndnq_f32(vmulq_f32(x, vdupq_n_f32(1.44269504088896341f)));
  float32x4_t r = vfmsq_f32(x, n, vdupq_n_f32(0.693359375f));
  r = vfmsq_f32(r, n, vdupq_n_f32(-2.12194440e-4f));
  float32x4_t p = vdupq_n_f32(1.9875691500e-4f);
  p = vfmaq_f32(vdupq_n_f32(1.3981999507e-3f), p, r);
  p = vfmaq_f32(vdupq_n_f32(8.3334519073e-3f), p, r);
  p = vfmaq_f32(vdupq_n_f32(4.1665795894e-2f), p, r);
  p = vfmaq_f32(vdupq_n_f32(1.6666665459e-1f), p, r);
  p = vfmaq_f32(vdupq_n_f32(5.0000001201e-1f), p, r);
  p = vfmaq_f32(vaddq_f32(r, vdupq_n_f32(1.f)), p, vmulq_f32(r, r));
  const int32x4_t ni = vcvtq_s32_f32(n), half = vshrq_n_s32(ni, 1);
  return vmulq_f32(vmulq_f32(p, pow2(half)), pow2(vsubq_s32(ni, half)));  // one rounding, as scalef
}
inline F16 fexp(F16 a) { return {exp4(a.q[0]), exp4(a.q[1]), exp4(a.q[2]), exp4(a.q[3])}; }

inline I16 izero() { return {vdupq_n_s32(0), vdupq_n_s32(0), vdupq_n_s32(0), vdupq_n_s32(0)}; }
inline F16 to_float(I16 a) { return {vcvtq_f32_s32(a.q[0]), vcvtq_f32_s32(a.q[1]), vcvtq_f32_s32(a.q[2]), vcvtq_f32_s32(a.q[3])}; }
inline I16 round_to_int(F16 a) {
  return {vcvtnq_s32_f32(a.q[0]), vcvtnq_s32_f32(a.q[1]), vcvtnq_s32_f32(a.q[2]), vcvtnq_s32_f32(a.q[3])};
}
inline int32_t isum(I16 a) { return vaddvq_s32(vaddq_s32(vaddq_s32(a.q[0], a.q[1]), vaddq_s32(a.q[2], a.q[3]))); }
inline void store_int8(int8_t* p, I16 a) {  // saturating
  const int16x8_t lo = vcombine_s16(vqmovn_s32(a.q[0]), vqmovn_s32(a.q[1]));
  const int16x8_t hi = vcombine_s16(vqmovn_s32(a.q[2]), vqmovn_s32(a.q[3]));
  vst1q_s8(p, vcombine_s8(vqmovn_s16(lo), vqmovn_s16(hi)));
}

inline int8x16_t four_bytes(const int8_t* p) {  // x[0..3] in every 32-bit lane
  int32_t v;
  std::memcpy(&v, p, 4);
  return vreinterpretq_s8_s32(vdupq_n_s32(v));
}
// ip[i]_j = sum over Quads k-quads of Bytes bytes each of w[j][k] x_i[k], where decode(quad, w) gives a k-quad's
// 64 codes as four vectors of bytes: rows 0-3, 4-7 (the low nibbles of bytes 0-15, 16-31), 8-11, 12-15 (their high
// nibbles), 4 consecutive k each, so sdot against x's 4 bytes gives 4 rows. Codes below 128 are valid int8. The
// decoder may hold state (a table); dot_codes takes a plain function.
template <int MT, int Quads, int Bytes, typename Decode>
inline void dot_decoded(const uint8_t* codes, const int8_t* x, int64_t k_stride, I16* ip, const Decode& decode) {
  for (int i = 0; i < MT; ++i) ip[i] = izero();
  for (int kq = 0; kq < Quads; ++kq) {
    int8x16_t w[4];
    decode(codes + Bytes * kq, w);
    for (int i = 0; i < MT; ++i) {
      const int8x16_t xb = four_bytes(x + i * k_stride + 4 * kq);
      for (int j = 0; j < 4; ++j) ip[i].q[j] = vdotq_s32(ip[i].q[j], w[j], xb);
    }
  }
}
using QuadDecoder = void (*)(const uint8_t*, int8x16_t*);
template <int MT, int Quads, int Bytes, QuadDecoder decode>
inline void dot_codes(const uint8_t* codes, const int8_t* x, int64_t k_stride, I16* ip) {
  dot_decoded<MT, Quads, Bytes>(codes, x, k_stride, ip, [](const uint8_t* quad, int8x16_t* w) { decode(quad, w); });
}
inline void int4_quad(const uint8_t* quad, int8x16_t* w) {
  const uint8x16_t low = vdupq_n_u8(0x0F), c0 = vld1q_u8(quad), c1 = vld1q_u8(quad + 16);
  w[0] = vreinterpretq_s8_u8(vandq_u8(c0, low));
  w[1] = vreinterpretq_s8_u8(vandq_u8(c1, low));
  w[2] = vreinterpretq_s8_u8(vshrq_n_u8(c0, 4));
  w[3] = vreinterpretq_s8_u8(vshrq_n_u8(c1, 4));
}
// one group of 32 k (8 k-quads of 32 bytes)
template <int MT>
inline void dot_int4_group(const uint8_t* codes, const int8_t* x, int64_t k_stride, I16* ip) {
  dot_codes<MT, 8, 32, int4_quad>(codes, x, k_stride, ip);
}
// `value` in byte l of 16 where bit l of the two bytes at p is set, else 0
inline uint8x16_t bit_lanes(const uint8_t* p, uint8_t value) {
  static const uint8_t kBit[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
  const uint8x16_t spread = vcombine_u8(vdup_n_u8(p[0]), vdup_n_u8(p[1]));
  return vandq_u8(vtstq_u8(spread, vld1q_u8(kBit)), vdupq_n_u8(value));
}
// codes plus `value` where a k-quad's bit plane (8 bytes at plane, bit l for lane l) is set
inline void add_bit_plane(const uint8_t* plane, uint8_t value, int8x16_t* w) {
  for (int j = 0; j < 4; ++j) w[j] = vorrq_s8(w[j], vreinterpretq_s8_u8(bit_lanes(plane + 2 * j, value)));
}
// int5: the int4 codes plus 16 where the k-quad's fifth bit (bytes 32-39, bit l for lane l) is set
inline void int5_quad(const uint8_t* quad, int8x16_t* w) {
  int4_quad(quad, w);
  add_bit_plane(quad + 32, 16, w);
}
// one group of 32 k (8 k-quads of 40 bytes)
template <int MT>
inline void dot_int5_group(const uint8_t* codes, const int8_t* x, int64_t k_stride, I16* ip) {
  dot_codes<MT, 8, 40, int5_quad>(codes, x, k_stride, ip);
}
// int6: the int4 codes plus the high bits (bytes 32-47: lane l's two at bits 2 (l / 16) of byte l % 16) at bits 4-5
inline void int6_quad(const uint8_t* quad, int8x16_t* w) {
  const uint8x16_t h = vld1q_u8(quad + 32), mask = vdupq_n_u8(0x30);
  const uint8x16_t high[4] = {vandq_u8(vshlq_n_u8(h, 4), mask), vandq_u8(vshlq_n_u8(h, 2), mask), vandq_u8(h, mask),
                              vandq_u8(vshrq_n_u8(h, 2), mask)};
  int4_quad(quad, w);
  for (int j = 0; j < 4; ++j) w[j] = vorrq_s8(w[j], vreinterpretq_s8_u8(high[j]));
}
// one sub-block of 16 k (4 k-quads of 48 bytes)
template <int MT>
inline void dot_int6_sub(const uint8_t* codes, const int8_t* x, int64_t k_stride, I16* ip) {
  dot_codes<MT, 4, sub_quad_bytes(6), int6_quad>(codes, x, k_stride, ip);
}
// int2 (GGUF's Q2_K): a k-quad's two bits (bytes 0-15: lane l's at bits 2 (l / 16) of byte l % 16)
inline void int2_quad(const uint8_t* quad, int8x16_t* w) {
  const uint8x16_t p = vld1q_u8(quad), mask = vdupq_n_u8(3);
  w[0] = vreinterpretq_s8_u8(vandq_u8(p, mask));
  w[1] = vreinterpretq_s8_u8(vandq_u8(vshrq_n_u8(p, 2), mask));
  w[2] = vreinterpretq_s8_u8(vandq_u8(vshrq_n_u8(p, 4), mask));
  w[3] = vreinterpretq_s8_u8(vshrq_n_u8(p, 6));
}
// int3: int2's bits plus 4 where the third bit (bytes 16-23, bit l for lane l) is set
inline void int3_quad(const uint8_t* quad, int8x16_t* w) {
  int2_quad(quad, w);
  add_bit_plane(quad + 16, 4, w);
}
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
inline I16 widen_int8(const int8_t* p) {
  const int8x16_t v = vld1q_s8(p);
  const int16x8_t lo = vmovl_s8(vget_low_s8(v)), hi = vmovl_s8(vget_high_s8(v));
  return {vmovl_s16(vget_low_s16(lo)), vmovl_s16(vget_high_s16(lo)), vmovl_s16(vget_low_s16(hi)), vmovl_s16(vget_high_s16(hi))};
}
inline I16 imadd(I16 a, I16 b, I16 c) {  // a b + c
  return {vmlaq_s32(c.q[0], a.q[0], b.q[0]), vmlaq_s32(c.q[1], a.q[1], b.q[1]), vmlaq_s32(c.q[2], a.q[2], b.q[2]),
          vmlaq_s32(c.q[3], a.q[3], b.q[3])};
}
// lane l: the int16 pair (c a[l], c b[l]) (c a, c b within int16)
inline I16 widen_pairs(const int8_t* a, const int8_t* b, int16_t c) {
  const int8x16_t va = vld1q_s8(a), vb = vld1q_s8(b);
  const int8x16_t ab0 = vzip1q_s8(va, vb), ab1 = vzip2q_s8(va, vb);  // a0 b0 .. a7 b7, a8 b8 .. a15 b15
  const int16x8_t p[4] = {vmulq_n_s16(vmovl_s8(vget_low_s8(ab0)), c), vmulq_n_s16(vmovl_high_s8(ab0), c),
                          vmulq_n_s16(vmovl_s8(vget_low_s8(ab1)), c), vmulq_n_s16(vmovl_high_s8(ab1), c)};
  return {vreinterpretq_s32_s16(p[0]), vreinterpretq_s32_s16(p[1]), vreinterpretq_s32_s16(p[2]),
          vreinterpretq_s32_s16(p[3])};
}
// acc + w.lo x.lo + w.hi x.hi per lane, w's lanes and x int16 pairs (exact: the caller keeps it within int32)
inline I16 idot_pairs(I16 w, int32_t x, I16 acc) {
  const int16x8_t xv = vreinterpretq_s16_s32(vdupq_n_s32(x));
  for (int r = 0; r < 4; ++r) {
    const int16x8_t wv = vreinterpretq_s16_s32(w.q[r]);
    const int32x4_t lo = vmull_s16(vget_low_s16(wv), vget_low_s16(xv)), hi = vmull_high_s16(wv, xv);
    acc.q[r] = vaddq_s32(acc.q[r], vpaddq_s32(lo, hi));  // products of lanes' halves, summed pairwise
  }
  return acc;
}
// ip[i]_j = sum over one group of 32 k (8 k-quads of 16 rows x 4 int8) of w[j][k] x_i[k], exact
constexpr int32_t kInt8Bias = 0;
template <int MT>
inline void dot_int8_group(const int8_t* q, const int8_t* x, int64_t k_stride, I16* ip) {
  for (int i = 0; i < MT; ++i) ip[i] = izero();
  for (int kq = 0; kq < 8; ++kq) {
    int8x16_t w[4];
    for (int j = 0; j < 4; ++j) w[j] = vld1q_s8(q + 64 * kq + 16 * j);
    for (int i = 0; i < MT; ++i) {
      const int8x16_t xb = four_bytes(x + i * k_stride + 4 * kq);
      for (int j = 0; j < 4; ++j) ip[i].q[j] = vdotq_s32(ip[i].q[j], w[j], xb);
    }
  }
}
// The IQ4 layout's 16 values as signed bytes (sdot multiplies them as they are)
constexpr int32_t kIq4Bias = 0;
// Quads k-quads of int4's 32 bytes, the codes indices into the 16 values
template <int MT, int Quads>
inline void dot_table(const uint8_t* codes, const int8_t* x, int64_t k_stride, const Iq4Table& values, I16* ip) {
  const int8x16_t table = vld1q_s8(values.v);
  dot_decoded<MT, Quads, 32>(codes, x, k_stride, ip, [table](const uint8_t* quad, int8x16_t* w) {
    int4_quad(quad, w);
    for (int j = 0; j < 4; ++j) w[j] = vqtbl1q_s8(table, vreinterpretq_u8_s8(w[j]));
  });
}
// one group of 32 k
template <int MT>
inline void dot_iq4_group(const uint8_t* codes, const int8_t* x, int64_t k_stride, const Iq4Table& values, I16* ip) {
  dot_table<MT, 8>(codes, x, k_stride, values, ip);
}
constexpr bool kUnsignedTables = false;  // dot_iq4_group is dot_table already
inline I16 isub_scalar(I16 a, int32_t x) {
  const int32x4_t v = vdupq_n_s32(x);
  return {vsubq_s32(a.q[0], v), vsubq_s32(a.q[1], v), vsubq_s32(a.q[2], v), vsubq_s32(a.q[3], v)};
}

inline void prefetch(const void* p) { __builtin_prefetch(p); }
inline void prefetch_once(const void* p) { __builtin_prefetch(p, 0, 0); }  // read once: no temporal locality
