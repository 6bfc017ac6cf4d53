// Weight-only int4 / int8 matmuls: x [M, K] (float32 or bfloat16) times a quantized W [N, K]^T -> y [M, N] in
// x's dtype. Torch reference: cpu_quant_matmul.py. The body is in cpu_quant_matmul_body.h, compiled once
// per instruction set; these are the ops, their checks and the threading.
//
// The activations are quantized on the fly to int8, one scale per block of 64 along K (a = max|x| / 127,
// measured lossless on SmolLM2), so the inner product is an int8 dot product (AVX512-VNNI's vpdpbusd, or
// AVX2's vpmaddubsw + vpmaddwd) instead of float FMAs.
//
// Weights are tiled 16 output rows at a time, so a vector lane is an output row: lane j holds 4
// consecutive k of row j, multiplied by the 4 matching activation bytes broadcast, and the float scales
// apply to 16 rows at once (no horizontal sums). N must be a multiple of 16.
// int4: q in [0, 15], w = d * q + mn per group of 32 along K (GGUF's Q4_1). codes [N/16, K/4, 32] bytes:
//   for a tile and a k-quad, byte p holds row p/4's k % 4 = p % 4 in its low nibble and row 8 + p/4's in
//   its high nibble; d, mn float16 [N/16, K/32, 16]. sum_k w x = sum_g d_g a sum(q xq) + mn_g a sum(xq).
// int8: w = s * q, q int8 in [-127, 127] [N/16, K/4, 64] (16 rows x 4 k), s float32 [N].
#include "cpu_isa.h"
#include "cpu_ops.h"

namespace radixlm_cpu {

// x quantized per 64-block: q [M, K] int8, a [M, K / 64], s (int32) and t = a * s (float) [M, K / 32].
struct QuantizedX {
  std::vector<int8_t> q;
  std::vector<float> a, t;
  std::vector<int32_t> s;
  int64_t k = 0, nb = 0;
  QuantizedX(int64_t m, int64_t k_) : q(m * k_), a(m * (k_ / 64)), t(m * (k_ / 32)), s(m * (k_ / 32)), k(k_), nb(k_ / 64) {}
};

}  // namespace radixlm_cpu

using radixlm_cpu::QuantizedX;
#define RADIXLM_BODY "cpu_quant_matmul_body.h"
#include "cpu_foreach_isa.h"

namespace radixlm_cpu {
namespace {

void check_x(const at::Tensor& x, int64_t k) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous(), "x must be a contiguous [M, K] tensor");
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16, "x must be float32 or bfloat16");
  TORCH_CHECK(x.size(1) == k && k % 64 == 0, "x has ", x.size(1), " columns; the weight has ", k,
              " (a multiple of 64)");
}

template <typename T>
QuantizedX quantize(const at::Tensor& x, int64_t isa) {
  QuantizedX xq(x.size(0), x.size(1));
  const T* xd = x.data_ptr<T>();
  at::parallel_for(0, x.size(0), 16, [&](int64_t r0, int64_t r1) { RADIXLM_ISA_CALL(isa, quantize_rows<T>, xd, r0, r1, xq); });
  return xq;
}

}  // namespace

at::Tensor int4_linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& d, const at::Tensor& mn, int64_t isa) {
  check_isa(isa);
  const int64_t n = d.size(0) * 16, k = d.size(1) * 32, m = x.size(0);
  check_x(x, k);
  TORCH_CHECK(w.scalar_type() == at::kByte && d.scalar_type() == at::kHalf && mn.scalar_type() == at::kHalf,
              "int4 weight: uint8 codes with float16 scales and minimums");
  TORCH_CHECK(w.numel() * 2 == n * k && mn.sizes() == d.sizes() && w.is_contiguous() && d.is_contiguous() &&
              mn.is_contiguous(), "int4 weight: codes, scales and minimums disagree");
  at::Tensor y = at::empty({m, n}, x.options());
  dispatch_float_bf16(x, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const QuantizedX xq = quantize<T>(x, isa);
    const auto* codes = w.data_ptr<uint8_t>();
    const auto* dd = d.data_ptr<at::Half>();
    const auto* md = mn.data_ptr<at::Half>();
    T* out = y.data_ptr<T>();
    at::parallel_for(0, n / 16, 4, [&](int64_t t0, int64_t t1) {
      RADIXLM_ISA_CALL(isa, int4_tiles<T>, codes, dd, md, n, t0, t1, xq, m, out);
    });
  });
  return y;
}

at::Tensor int8_linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& s, int64_t isa) {
  check_isa(isa);
  const int64_t n = s.size(0), k = w.numel() / std::max<int64_t>(n, 1), m = x.size(0);
  TORCH_CHECK(n % 16 == 0, "int8 weight rows must be a multiple of 16, got ", n);
  check_x(x, k);
  TORCH_CHECK(w.scalar_type() == at::kChar && s.scalar_type() == at::kFloat && w.is_contiguous() && s.is_contiguous(),
              "int8 weight: int8 with float32 scales");
  at::Tensor y = at::empty({m, n}, x.options());
  dispatch_float_bf16(x, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const QuantizedX xq = quantize<T>(x, isa);
    const auto* q = w.data_ptr<int8_t>();
    const float* sd = s.data_ptr<float>();
    T* out = y.data_ptr<T>();
    at::parallel_for(0, n / 16, 4, [&](int64_t t0, int64_t t1) {
      RADIXLM_ISA_CALL(isa, int8_tiles<T>, q, sd, n, t0, t1, xq, m, out);
    });
  });
  return y;
}

}  // namespace radixlm_cpu

TORCH_LIBRARY(radixlm_cpu, m) {
  m.def("isa_supported(int isa) -> bool", [](int64_t isa) { return radixlm_cpu::isa_supported(isa); });
  m.def("int4_linear(Tensor x, Tensor w, Tensor d, Tensor mn, int isa) -> Tensor");
  m.def("int8_linear(Tensor x, Tensor w, Tensor s, int isa) -> Tensor");
}

TORCH_LIBRARY_IMPL(radixlm_cpu, CPU, m) {
  m.impl("int4_linear", &radixlm_cpu::int4_linear);
  m.impl("int8_linear", &radixlm_cpu::int8_linear);
}
