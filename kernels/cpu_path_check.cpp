// A standalone check (no torch) that a kernel path gives the portable path's results bit for bit: the kernel
// bodies (matmuls, attention, RMSNorm, silu * up, RoPE + KV store, the sampler's exponentials) are compiled twice, against the portable
// vector layer and against the one named by RADIXLM_CHECK_PATH, run on the same random inputs, and every
// output is compared byte for byte. The portable path is itself checked against torch by the test suite on
// x86, so equality carries that check over to a path no machine here can load into torch: NEON, built with
// Debian's aarch64 cross compiler and run under qemu-user (tests/test_neon_kernels.py).
//
//   aarch64-linux-gnu-g++ -std=c++17 -O2 -ffp-contract=off -DRADIXLM_CHECK_PATH=neon kernels/cpu_path_check.cpp
//
// Prints one line per check and "N passed, M failed"; exits non-zero on any difference.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

namespace at {  // the two element types the bodies name, with torch's layout (uint16 bits)
struct BFloat16 {
  uint16_t x;
};
struct Half {
  uint16_t x;
  operator float() const {  // IEEE half -> float, exact
    const uint32_t sign = static_cast<uint32_t>(x & 0x8000) << 16, exp = (x >> 10) & 31, man = x & 1023;
    uint32_t bits;
    if (exp == 31) {
      bits = sign | 0x7F800000u | (man << 13);
    } else if (exp == 0) {
      float f = std::ldexp(static_cast<float>(man), -24);
      return sign ? -f : f;
    } else {
      bits = sign | ((exp + 112) << 23) | (man << 13);
    }
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
  }
};
}  // namespace at

#include "cpu_types.h"

namespace radixlm_portable {
#include "cpu_vec_portable.h"
#include "cpu_matmul_body.h"
#include "cpu_attention_body.h"
#include "cpu_norm_act_body.h"
#include "cpu_rope_body.h"
#include "cpu_sample_body.h"
}  // namespace radixlm_portable

#if defined(__aarch64__)
#pragma GCC push_options
#pragma GCC target("arch=armv8.2-a+dotprod")
namespace radixlm_path {
#include "cpu_vec_neon.h"
#include "cpu_matmul_body.h"
#include "cpu_attention_body.h"
#include "cpu_norm_act_body.h"
#include "cpu_rope_body.h"
#include "cpu_sample_body.h"
}  // namespace radixlm_path
#pragma GCC pop_options
#else
#error "cpu_path_check.cpp checks the NEON path: build it for aarch64"
#endif

namespace {

uint64_t g_state = 0x9E3779B97F4A7C15ull;
uint32_t next_u32() {  // xorshift64*
  g_state ^= g_state >> 12;
  g_state ^= g_state << 25;
  g_state ^= g_state >> 27;
  return static_cast<uint32_t>((g_state * 0x2545F4914F6CDD1Dull) >> 32);
}
float uniform(float lo, float hi) { return lo + (hi - lo) * (next_u32() >> 8) * (1.f / 16777216.f); }
uint16_t bf16(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return static_cast<uint16_t>((b + ((b >> 16) & 1) + 0x7FFF) >> 16);
}
uint16_t half_bits(float f) {  // normal halves only (|f| in [2^-14, 65504]), round toward zero
  uint32_t b;
  std::memcpy(&b, &f, 4);
  const uint32_t sign = (b >> 16) & 0x8000, exp = ((b >> 23) & 255) - 112;
  return static_cast<uint16_t>(sign | (exp << 10) | ((b >> 13) & 1023));
}

int g_passed = 0, g_failed = 0;
template <typename T>
void expect_same(const char* what, const std::vector<T>& a, const std::vector<T>& b) {
  const bool same = a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
  std::printf("%s %s\n", same ? "PASS" : "FAIL", what);
  (same ? g_passed : g_failed) += 1;
}

template <typename T>
std::vector<T> random_rows(int64_t n, float scale) {
  std::vector<T> v(n);
  for (auto& e : v) {
    const float f = uniform(-scale, scale);
    if constexpr (std::is_same_v<T, float>) e = f; else e.x = bf16(f);
  }
  return v;
}

// x [M, K] quantized, then int4 (with and without minimums), int5, int6, int8, int3 and int2 tiles, int4 and int5 in the
// K-quant layout too, int4 in the IQ4 layout (IQ4_NL's values and a grid's) and the table form; M covers every row run
template <typename T>
void check_matmuls(int64_t m, const char* dtype) {
  static const int8_t kGrid[16] = {-43, -25, -8, 8, 25, 43, -9, -7, -1, 1, 7, 9, 0, 0, 0, 0};  // GRID_VALUES
  const int64_t k = 256, n = 48, nb = k / 64;
  const std::vector<T> x = random_rows<T>(m * k, 2.f);
  std::vector<uint8_t> codes(n / 16 * (k / 4) * 32), codes5(n / 16 * (k / 4) * 40), codes6(n / 16 * (k / 16) * 208);
  std::vector<uint8_t> k4(n / 16 * (k / 32) * 288), k5(n / 16 * (k / 32) * 352);  // scale bytes: any, as 6-bit are
  std::vector<uint8_t> codes3(n / 16 * (k / 16) * 112);
  for (auto* c : {&codes, &codes5, &codes6, &k4, &k5, &codes3}) {
    for (auto& b : *c) b = static_cast<uint8_t>(next_u32());
  }
  std::vector<at::Half> d(n * k / 32), mn(n * k / 32);
  for (auto& h : d) h.x = half_bits(uniform(0.01f, 0.1f));
  for (auto& h : mn) h.x = half_bits(uniform(-0.5f, -0.01f));
  std::vector<int8_t> q8(n * k);
  for (auto& q : q8) q = static_cast<int8_t>(static_cast<int>(next_u32() % 255) - 127);
  std::vector<at::Half> d8(n * k / 32);
  for (auto& h : d8) h.x = half_bits(uniform(0.001f, 0.01f));
  auto run = [&](auto quantize, auto int4, auto int5, auto int6, auto int8, auto int3, auto iq4, auto int2, auto table,
                 std::vector<int8_t>& xq_q, std::vector<std::vector<T>>& y) {
    std::vector<float> a(m * nb * 2), t(m * nb * 2);  // one scale per group of 32
    std::vector<int32_t> s(m * nb * 2);
    std::vector<int16_t> s16(m * nb * 4);
    xq_q.assign(m * k, 0);
    const QuantizedX xq{xq_q.data(), a.data(), t.data(), s.data(), s16.data(), k, nb, m <= kStreamRows};
    quantize(x.data(), 0, m, 0, nb, xq);
    y.assign(13, std::vector<T>(m * n));
    int4(codes.data(), d.data(), mn.data(), false, n, 0, n / 16, xq, m, y[0].data());
    int4(codes.data(), d.data(), nullptr, false, n, 0, n / 16, xq, m, y[1].data());
    int5(codes5.data(), d.data(), mn.data(), false, n, 0, n / 16, xq, m, y[2].data());
    int6(codes6.data(), d8.data(), n, 0, n / 16, xq, m, y[3].data());  // d8's first K / 256 per row as d
    int8(q8.data(), d8.data(), n, 0, n / 16, xq, m, y[4].data());
    int4(k4.data(), d8.data(), mn.data(), true, n, 0, n / 16, xq, m, y[5].data());  // d8, mn: d, -dmin per 256
    int5(k5.data(), d8.data(), mn.data(), true, n, 0, n / 16, xq, m, y[6].data());
    int3(codes3.data(), d8.data(), n, 0, n / 16, xq, m, y[7].data());
    iq4(codes.data(), d8.data(), kIq4Values.v, false, n, 0, n / 16, xq, m, y[8].data());  // int4's bytes as codes
    iq4(k4.data(), d8.data(), kIq4Values.v, true, n, 0, n / 16, xq, m, y[9].data());  // IQ4_XS: 272 of k4's 288
    iq4(k4.data(), d8.data(), kGrid, true, n, 0, n / 16, xq, m, y[11].data());  // the same codes into a grid's values
    table(codes6.data(), d8.data(), kGrid, n, 0, n / 16, xq, m, y[12].data());  // 144 of codes6's 208 a sub-block
    int2(codes6.data(), d8.data(), mn.data(), n, 0, n / 16, xq, m, y[10].data());  // 96 of codes6's 208 a sub-block
  };
  std::vector<int8_t> pq, nq;
  std::vector<std::vector<T>> p, o;
  run(radixlm_portable::quantize_rows<T>, radixlm_portable::int4_tiles<T>, radixlm_portable::int5_tiles<T>,
      radixlm_portable::int6_tiles<T>, radixlm_portable::int8_tiles<T>, radixlm_portable::int3_tiles<T>,
      radixlm_portable::iq4_tiles<T>, radixlm_portable::int2_tiles<T>, radixlm_portable::table_tiles<T>, pq, p);
  run(radixlm_path::quantize_rows<T>, radixlm_path::int4_tiles<T>, radixlm_path::int5_tiles<T>,
      radixlm_path::int6_tiles<T>, radixlm_path::int8_tiles<T>, radixlm_path::int3_tiles<T>,
      radixlm_path::iq4_tiles<T>, radixlm_path::int2_tiles<T>, radixlm_path::table_tiles<T>, nq, o);
  const std::string tag = std::string(dtype) + " M=" + std::to_string(m);
  expect_same(("quantize x " + tag).c_str(), pq, nq);
  const char* names[13] = {"int4 matmul ", "int4 matmul, no minimums ", "int5 matmul ", "int6 matmul ", "int8 matmul ",
                           "int4 matmul, K-quant layout ", "int5 matmul, K-quant layout ", "int3 matmul ",
                           "int4 matmul, IQ4 layout ", "int4 matmul, IQ4_XS layout ", "int2 matmul ",
                           "int4 matmul, IQ4_XS layout, grid values ", "int4 matmul, table form "};
  for (int w = 0; w < 13; ++w) expect_same((names[w] + tag).c_str(), p[w], o[w]);
}

// one extend task (n tokens x G heads) over scattered slots of a head-major pool, D = 64
template <typename T>
void check_attention(int64_t n, int64_t len, const char* dtype) {
  constexpr int DC = 4, D = 64;
  const int64_t g = 3, slots = len + 17;
  const std::vector<T> pool_k = random_rows<T>(slots * D, 1.f), pool_v = random_rows<T>(slots * D, 1.f);
  const std::vector<T> q = random_rows<T>(n * g * D, 1.f);
  std::vector<int64_t> slot(len);
  for (int64_t t = 0; t < len; ++t) slot[t] = (t * 7 + 3) % slots;
  const Rows rows{slot.data(), len / 2, slot.data() + len / 2, len};
  const QueryRows qr{n, g, g * D};
  auto run = [&](auto attend, std::vector<T>& out) {
    Scratch scratch;
    out.assign(n * g * D, T{});
    attend(q.data(), qr, pool_k.data(), pool_v.data(), rows, 0.125f, scratch, out.data(), qr);
  };
  std::vector<T> po, no;
  run(radixlm_portable::attend_rows<DC, T>, po);
  run(radixlm_path::attend_rows<DC, T>, no);
  const std::string tag = std::string(dtype) + " n=" + std::to_string(n) + " keys=" + std::to_string(len);
  expect_same(("attention " + tag).c_str(), po, no);
  // the same task shared by two threads stage by stage (keys, rows, value chunks), run here one after the other
  namespace p = radixlm_path;
  const int64_t r_count = n * g, stride = p::score_stride(rows), cb = p::value_chunks<DC>();
  std::vector<float> s(r_count * stride, 0.f), inv(r_count), qf;
  std::vector<T> so(n * g * D, T{});
  const int64_t kh = (len / 2 + 3) / 4 * 4, rh = (r_count + 1) / 2, ch = (DC / 2 + cb - 1) / cb * cb;
  p::attend_scores<DC>(q.data(), qr, pool_k.data(), rows, 0.125f, s.data(), qf, 0, kh);
  p::attend_scores<DC>(q.data(), qr, pool_k.data(), rows, 0.125f, s.data(), qf, kh, len);
  p::attend_softmax(qr, rows, s.data(), inv.data(), 0, rh);
  p::attend_softmax(qr, rows, s.data(), inv.data(), rh, r_count);
  p::attend_values<DC>(qr, pool_v.data(), rows, s.data(), inv.data(), so.data(), qr, 0, ch);
  p::attend_values<DC>(qr, pool_v.data(), rows, s.data(), inv.data(), so.data(), qr, ch, DC);
  expect_same(("attention in stages " + tag).c_str(), po, so);
}

template <typename T>
void check_norm_act_rope(const char* dtype) {
  const int64_t rows = 3, h = 192, inter = 160, hq = 3, hkv = 1, d = 64, slots = 8;
  const std::vector<T> x = random_rows<T>(rows * h, 3.f), w = random_rows<T>(h, 1.f);
  const std::vector<T> gu = random_rows<T>(rows * 2 * inter, 8.f), qkv = random_rows<T>(rows * (hq + 2 * hkv) * d, 1.f);
  const int64_t table_rows = 11, pos[rows] = {10, 2, 6};  // rows of the rotary tables
  const std::vector<float> cs = random_rows<float>(table_rows * d / 2, 1.f);
  const std::vector<float> sn = random_rows<float>(table_rows * d / 2, 1.f);
  const std::vector<T> bias = random_rows<T>((hq + 2 * hkv) * d, 1.f);  // Qwen2's qkv bias
  const int64_t loc[rows] = {5, 0, 7};
  auto run = [&](auto norm, auto silu, auto rope, std::vector<T>& res, std::vector<T>& normed, std::vector<T>& act,
                 std::vector<T>& qo, std::vector<T>& kc, std::vector<T>& vc) {
    res = random_rows<T>(rows * h, 0.f);
    normed.assign(rows * h, T{}), act.assign(rows * inter, T{});
    qo.assign(rows * hq * d, T{}), kc.assign(hkv * slots * d, T{}), vc.assign(hkv * slots * d, T{});
    norm(x.data(), res.data(), w.data(), 0, rows, h, 1e-5f, normed.data());
    silu(gu.data(), 0, rows, 0, inter, inter, act.data());
    rope(qkv.data(), bias.data(), 0, rows, 0, hq + hkv, hq, hkv, cs.data(), sn.data(), pos, loc, qo.data(),
         kc.data(), vc.data(), slots * d);
  };
  std::vector<T> p[6], o[6];
  run(radixlm_portable::rms_norm_rows<T, T>, radixlm_portable::silu_mul_rows<T>, radixlm_portable::rope_store_rows<4, T>,
      p[0], p[1], p[2], p[3], p[4], p[5]);
  run(radixlm_path::rms_norm_rows<T, T>, radixlm_path::silu_mul_rows<T>, radixlm_path::rope_store_rows<4, T>, o[0], o[1],
      o[2], o[3], o[4], o[5]);
  const char* names[6] = {"residual add", "RMSNorm", "silu * up", "RoPE q", "RoPE k store", "v store"};
  for (int i = 0; i < 6; ++i) expect_same((std::string(names[i]) + " " + dtype).c_str(), p[i], o[i]);
}

// the sampler's exponentials and their block sums and maxima, over a row with a tail and -inf logits (a grammar's)
void check_sample_exponentials() {
  for (const int64_t n : {int64_t{49152}, int64_t{1000}, int64_t{37}}) {
    std::vector<float> row = random_rows<float>(n, 12.f);
    for (int64_t j = 0; j < n; j += 7) row[j] = -INFINITY;
    float top = -INFINITY;
    for (const float v : row) top = v > top ? v : top;
    const int64_t blocks = (n + 255) / 256;
    std::vector<float> p[3] = {std::vector<float>(n), std::vector<float>(blocks), std::vector<float>(blocks)};
    std::vector<float> o[3] = {p[0], p[1], p[2]};
    const float scale = 1.f / 0.7f;
    radixlm_portable::exp_blocks(row.data(), scale, top * scale, 0, n, n, p[0].data(), p[1].data(), p[2].data());
    radixlm_path::exp_blocks(row.data(), scale, top * scale, 0, n, n, o[0].data(), o[1].data(), o[2].data());
    const char* names[3] = {"sampler exponentials", "sampler block sums", "sampler block maxima"};
    for (int i = 0; i < 3; ++i) expect_same((std::string(names[i]) + " " + std::to_string(n)).c_str(), p[i], o[i]);
  }
}

// the int16 pair ops the matmuls' pair form uses (widen_pairs, idot_pairs), at their extremes and at random, though
// the path may not choose that form itself (kPairDot)
void check_pair_ops() {
  auto lanes = [](auto op) {
    std::vector<int32_t> out(16);
    for (int i = 0; i < 16; ++i) std::memcpy(&out[i], reinterpret_cast<const char*>(&op) + 4 * i, 4);
    return out;
  };
  for (int round = 0; round < 8; ++round) {
    int8_t a[16], b[16];
    for (int i = 0; i < 16; ++i) {
      a[i] = round == 0 ? -128 : static_cast<int8_t>(next_u32());
      b[i] = round == 0 ? 127 : static_cast<int8_t>(next_u32());
    }
    const int16_t c = round == 0 ? -32 : static_cast<int16_t>(static_cast<int>(next_u32() % 65) - 32);
    const int32_t x = round == 0 ? static_cast<int32_t>(0xF810'07F0u) : static_cast<int32_t>(next_u32() & 0x0FFF'0FFF);
    namespace po = radixlm_portable;
    namespace pa = radixlm_path;
    const std::vector<int32_t> want = lanes(po::idot_pairs(po::widen_pairs(a, b, c), x, po::izero()));
    const std::vector<int32_t> got = lanes(pa::idot_pairs(pa::widen_pairs(a, b, c), x, pa::izero()));
    expect_same(("int16 pair ops, round " + std::to_string(round)).c_str(), want, got);
  }
}

}  // namespace

int main() {
  check_pair_ops();
  for (int64_t m : {1, 2, 3, 5, 8}) {
    check_matmuls<float>(m, "float32");
    check_matmuls<at::BFloat16>(m, "bfloat16");
  }
  for (auto [n, len] : {std::pair<int64_t, int64_t>{1, 1}, {1, 37}, {1, 300}, {5, 40}, {16, 16}}) {
    check_attention<float>(n, len, "float32");
    check_attention<at::BFloat16>(n, len, "bfloat16");
  }
  check_norm_act_rope<float>("float32");
  check_norm_act_rope<at::BFloat16>("bfloat16");
  check_sample_exponentials();
  std::printf("%d passed, %d failed\n", g_passed, g_failed);
  return g_failed == 0 ? 0 : 1;
}
