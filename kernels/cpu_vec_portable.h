// radixlm's vector layer, portable C++ form: 16 lanes as arrays, plain loops the compiler may vectorize
// (NEON on aarch64, SSE2 on baseline x86-64). This file is also the reference semantics of the layer:
// the AVX2 and AVX512 forms give bit for bit the same results (fused multiply-adds are std::fma, float to
// int conversions round to nearest even, reductions follow the trees written out below). The build uses
// -ffp-contract=off, so the compiler never fuses on its own.

constexpr int kIsa = 0;
constexpr int kMaxRows = 4;
constexpr bool kPairDot = true;  // the reference takes the pair form too, so the paths without it check it
constexpr int kValueRows = 2, kValueChunks = 4;  // attention: rows x 16-dim chunks of V accumulated at once

struct F16 { float v[16]; };
struct I16 { int32_t v[16]; };

#define RADIXLM_LANES(expr) \
  F16 r;                    \
  for (int i = 0; i < 16; ++i) r.v[i] = (expr); \
  return r

inline F16 fzero() { RADIXLM_LANES(0.f); }
inline F16 fset1(float x) { RADIXLM_LANES(x); }
inline F16 fload(const float* p) { RADIXLM_LANES(p[i]); }
inline float bf16_to_float(uint16_t b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
inline F16 fload(const at::BFloat16* p) { RADIXLM_LANES(bf16_to_float(p[i].x)); }
inline F16 fload(const at::Half* p) { RADIXLM_LANES(static_cast<float>(p[i])); }
inline F16 fload_n(const float* p, int64_t n) { RADIXLM_LANES(i < n ? p[i] : 0.f); }
inline void fstore(float* p, F16 a) {
  for (int i = 0; i < 16; ++i) p[i] = a.v[i];
}
inline uint16_t bf16_bits(float f) {  // round to nearest even as c10 does; NaN stays a quiet NaN
  if (std::isnan(f)) return 0x7FC0;
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  return static_cast<uint16_t>((bits + ((bits >> 16) & 1) + 0x7FFF) >> 16);
}
inline void fstore(at::BFloat16* p, F16 a) {
  for (int i = 0; i < 16; ++i) p[i].x = bf16_bits(a.v[i]);
}
inline void fstore_n(float* p, F16 a, int64_t n) {
  for (int i = 0; i < 16 && i < n; ++i) p[i] = a.v[i];
}
// 16 values in this layer's own lane order, for element-wise work only (no lane meets another between the load
// and the store): fstore_unordered puts back where fload_unordered took. Here the order is fload's.
template <typename T>
inline F16 fload_unordered(const T* p) { return fload(p); }
template <typename T>
inline void fstore_unordered(T* p, F16 a) { fstore(p, a); }
inline F16 round_bf16(F16 a) { RADIXLM_LANES(bf16_to_float(bf16_bits(a.v[i]))); }

inline F16 add(F16 a, F16 b) { RADIXLM_LANES(a.v[i] + b.v[i]); }
inline F16 sub(F16 a, F16 b) { RADIXLM_LANES(a.v[i] - b.v[i]); }
inline F16 mul(F16 a, F16 b) { RADIXLM_LANES(a.v[i] * b.v[i]); }
inline F16 div(F16 a, F16 b) { RADIXLM_LANES(a.v[i] / b.v[i]); }
inline F16 fmadd(F16 a, F16 b, F16 c) { RADIXLM_LANES(std::fma(a.v[i], b.v[i], c.v[i])); }
inline F16 fmax(F16 a, F16 b) { RADIXLM_LANES(a.v[i] > b.v[i] ? a.v[i] : b.v[i]); }  // b when unordered, as maxps
inline F16 fabs(F16 a) { RADIXLM_LANES(std::fabs(a.v[i])); }
inline F16 keep_first(F16 a, int64_t n) { RADIXLM_LANES(i < n ? a.v[i] : 0.f); }
inline F16 select_bits(F16 a, uint32_t bits, float x) { RADIXLM_LANES((bits >> i) & 1 ? x : a.v[i]); }
#undef RADIXLM_LANES

// s8_i = x_i + x_{i+8}; s4_i = s8_i + s8_{i+4}; s2_i = s4_i + s4_{i+2}; s2_0 + s2_1
inline float reduce_add(F16 a) {
  float s8[8], s4[4];
  for (int i = 0; i < 8; ++i) s8[i] = a.v[i] + a.v[i + 8];
  for (int i = 0; i < 4; ++i) s4[i] = s8[i] + s8[i + 4];
  return (s4[0] + s4[2]) + (s4[1] + s4[3]);
}
inline float reduce_max(F16 a) {
  float m = a.v[0];
  for (int i = 1; i < 16; ++i) m = a.v[i] > m ? a.v[i] : m;
  return m;
}
// per vector: v_L = (x_{4L} + x_{4L+2}) + (x_{4L+1} + x_{4L+3}) for the four 128-bit lanes, then
// (v_0 + v_2) + (v_1 + v_3)
inline void reduce4(F16 a0, F16 a1, F16 a2, F16 a3, float* out) {
  const F16* a[4] = {&a0, &a1, &a2, &a3};
  for (int j = 0; j < 4; ++j) {
    float v[4];
    for (int l = 0; l < 4; ++l) {
      const float* x = a[j]->v + 4 * l;
      v[l] = (x[0] + x[2]) + (x[1] + x[3]);
    }
    out[j] = (v[0] + v[2]) + (v[1] + v[3]);
  }
}

inline float pow2(int32_t n) {  // 2^n for n in [-126, 128] (128 is +inf)
  const uint32_t bits = static_cast<uint32_t>(n + 127) << 23;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
inline float exp1(float a) {
  const float x = std::fmin(std::fmax(a, -87.f), 88.75f);
  const float n = std::nearbyint(x * 1.44269504088896341f);
  float r = std::fma(-n, 0.693359375f, x);
  r = std::fma(-n, -2.12194440e-4f, r);
  float p = 1.9875691500e-4f;
  p = std::fma(p, r, 1.3981999507e-3f);
  p = std::fma(p, r, 8.3334519073e-3f);
  p = std::fma(p, r, 4.1665795894e-2f);
  p = std::fma(p, r, 1.6666665459e-1f);
  p = std::fma(p, r, 5.0000001201e-1f);
  p = std::fma(p, r * r, r + 1.f);
  const int32_t ni = static_cast<int32_t>(n), half = ni >> 1;
  return p * pow2(half) * pow2(ni - half);  // one rounding, as scalef
}
inline F16 fexp(F16 a) {
  F16 r;
  for (int i = 0; i < 16; ++i) r.v[i] = exp1(a.v[i]);
  return r;
}

inline I16 izero() { return I16{}; }
inline F16 to_float(I16 a) {
  F16 r;
  for (int i = 0; i < 16; ++i) r.v[i] = static_cast<float>(a.v[i]);
  return r;
}
inline I16 round_to_int(F16 a) {
  I16 r;
  for (int i = 0; i < 16; ++i) r.v[i] = static_cast<int32_t>(std::nearbyint(a.v[i]));
  return r;
}
inline int32_t isum(I16 a) {
  int32_t s = 0;
  for (int i = 0; i < 16; ++i) s += a.v[i];
  return s;
}
inline void store_int8(int8_t* p, I16 a) {
  for (int i = 0; i < 16; ++i) p[i] = static_cast<int8_t>(a.v[i] < -128 ? -128 : a.v[i] > 127 ? 127 : a.v[i]);
}

// Lane l's code in a k-quad: int4's 32 bytes hold lane l < 32 (row l / 4, k = l % 4) in byte l's low nibble
// and lane 32 + p (row 8 + p / 4) in byte p's high nibble; int5 adds 16 where bit l of bytes 32-39 is set, int6
// 16 times bits 2 (l / 16) .. + 1 of byte 32 + l % 16. int3: bits 2 (l / 16) .. + 1 of byte l % 16, plus 4 where bit
// l of bytes 16-23 is set.
template <int Bits>
inline int quad_code(const uint8_t* c, int lane) {
  if (Bits == 2) return (c[lane % 16] >> (2 * (lane / 16))) & 3;
  if (Bits == 3) return ((c[lane % 16] >> (2 * (lane / 16))) & 3) | (((c[16 + lane / 8] >> (lane % 8)) & 1) << 2);
  const int nibble = lane < 32 ? c[lane] & 15 : c[lane - 32] >> 4;
  if (Bits == 6) return nibble | (((c[32 + lane % 16] >> (2 * (lane / 16))) & 3) << 4);
  return Bits == 5 ? nibble | (((c[32 + lane / 8] >> (lane % 8)) & 1) << 4) : nibble;
}
// ip[i]_j = sum over Quads k-quads of codes (32 bytes each for int4, 40 for int5, 48 for int6, 24 for int3, 16 for
// int2) of w[j][k] x_i[k], w the code itself, or the value it indexes in `values` where given
template <int MT, int Bits, int Quads = 8>
inline void dot_codes_group(const uint8_t* codes, const int8_t* x, int64_t k_stride, I16* ip,
                            const int8_t* values = nullptr) {
  constexpr int kQuad = Bits == 5 ? 40 : Bits == 4 ? 32 : sub_quad_bytes(Bits);
  for (int i = 0; i < MT; ++i) {
    ip[i] = I16{};
    for (int kq = 0; kq < Quads; ++kq) {
      const int8_t* xi = x + i * k_stride + 4 * kq;
      for (int lane = 0; lane < 64; ++lane) {
        const int code = quad_code<Bits>(codes + kQuad * kq, lane);
        ip[i].v[lane / 4] += (values ? values[code] : code) * xi[lane % 4];
      }
    }
  }
}
template <int MT>
inline void dot_int4_group(const uint8_t* codes, const int8_t* x, int64_t k_stride, I16* ip) {
  dot_codes_group<MT, 4>(codes, x, k_stride, ip);
}
template <int MT>
inline void dot_int5_group(const uint8_t* codes, const int8_t* x, int64_t k_stride, I16* ip) {
  dot_codes_group<MT, 5>(codes, x, k_stride, ip);
}
// one sub-block of 16 k (4 k-quads of int6 codes)
template <int MT>
inline void dot_int6_sub(const uint8_t* codes, const int8_t* x, int64_t k_stride, I16* ip) {
  dot_codes_group<MT, 6, 4>(codes, x, k_stride, ip);
}
template <int MT>
inline void dot_int2_sub(const uint8_t* codes, const int8_t* x, int64_t k_stride, I16* ip) {
  dot_codes_group<MT, 2, 4>(codes, x, k_stride, ip);
}
// one sub-block of 16 k (4 k-quads of int3 codes)
template <int MT>
inline void dot_int3_sub(const uint8_t* codes, const int8_t* x, int64_t k_stride, I16* ip) {
  dot_codes_group<MT, 3, 4>(codes, x, k_stride, ip);
}
inline I16 widen_int8(const int8_t* p) {
  I16 r;
  for (int i = 0; i < 16; ++i) r.v[i] = p[i];
  return r;
}
inline I16 imadd(I16 a, I16 b, I16 c) {  // a b + c
  for (int i = 0; i < 16; ++i) c.v[i] += a.v[i] * b.v[i];
  return c;
}
// lane l: the int16 pair (c a[l], c b[l]) (c a, c b within int16): c a[l] in bits 0-15, c b[l] in 16-31
inline I16 widen_pairs(const int8_t* a, const int8_t* b, int16_t c) {
  I16 r;
  for (int i = 0; i < 16; ++i) {
    const uint32_t lo = static_cast<uint16_t>(c * a[i]), hi = static_cast<uint16_t>(c * b[i]);
    r.v[i] = static_cast<int32_t>(lo | hi << 16);
  }
  return r;
}
inline int32_t low16(int32_t v) { return static_cast<int16_t>(v & 0xFFFF); }  // an int16 pair's halves
inline int32_t high16(int32_t v) { return static_cast<int16_t>(static_cast<uint32_t>(v) >> 16); }
// acc + w.lo x.lo + w.hi x.hi per lane, w's lanes and x int16 pairs (exact: the caller keeps it within int32)
inline I16 idot_pairs(I16 w, int32_t x, I16 acc) {
  for (int i = 0; i < 16; ++i) acc.v[i] += low16(w.v[i]) * low16(x) + high16(w.v[i]) * high16(x);
  return acc;
}
// ip[i]_j = sum over one group of 32 k (8 k-quads of 16 rows x 4 int8) of w[j][k] x_i[k], exact
constexpr int32_t kInt8Bias = 0;
template <int MT>
inline void dot_int8_group(const int8_t* q, const int8_t* x, int64_t k_stride, I16* ip) {
  for (int i = 0; i < MT; ++i) {
    ip[i] = I16{};
    for (int kq = 0; kq < 8; ++kq) {
      const int8_t* w = q + 64 * kq;
      const int8_t* xi = x + i * k_stride + 4 * kq;
      for (int j = 0; j < 16; ++j) ip[i].v[j] += w[4 * j] * xi[0] + w[4 * j + 1] * xi[1] + w[4 * j + 2] * xi[2] + w[4 * j + 3] * xi[3];
    }
  }
}
// Quads k-quads of int4 codes into 16 values, multiplied as they are
template <int MT, int Quads>
inline void dot_table(const uint8_t* codes, const int8_t* x, int64_t k_stride, const Iq4Table& values, I16* ip) {
  dot_codes_group<MT, 4, Quads>(codes, x, k_stride, ip, values.v);
}
// one group of 32 k of the IQ4 layout's codes
constexpr int32_t kIq4Bias = 0;
constexpr bool kUnsignedTables = false;  // dot_iq4_group is dot_table already
template <int MT>
inline void dot_iq4_group(const uint8_t* codes, const int8_t* x, int64_t k_stride, const Iq4Table& values, I16* ip) {
  dot_table<MT, 8>(codes, x, k_stride, values, ip);
}
inline I16 isub_scalar(I16 a, int32_t x) {
  for (int i = 0; i < 16; ++i) a.v[i] -= x;
  return a;
}

inline void prefetch(const void* p) { __builtin_prefetch(p); }
inline void prefetch_once(const void* p) { __builtin_prefetch(p, 0, 0); }  // read once: no temporal locality
