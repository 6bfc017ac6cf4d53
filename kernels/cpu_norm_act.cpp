// The prefill's elementwise ops on AVX512 CPUs, one pass each: RMSNorm (optionally after the residual
// add) and SwiGLU's silu(gate) * up. torch's CPU ops take several passes in bfloat16 (800 x 576 rows:
// rms_norm 386 us, silu * mul over 800 x 3072 479 us, ad hoc); the compiled decode step gets the same
// fusion from inductor and keeps torch's ops. Torch references: cpu_norm_act.py.
//
// x, residual [T, H], weight [H] in x's dtype (float32 or bfloat16), computed in float32 and rounded once.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <cmath>
#include <type_traits>
#include <vector>

#include "cpu_simd.h"

namespace {

using radixlm_simd::dispatch_float_bf16;
using radixlm_simd::exp16;
using radixlm_simd::load16;
using radixlm_simd::round_bf16;
using radixlm_simd::store16;

// out = x / sqrt(mean(x^2) + eps) * w for one row of h (a multiple of 16) float32 values in buf.
template <typename T>
void norm_row(const float* buf, const T* w, int64_t h, float eps, T* out) {
  __m512 ss = _mm512_setzero_ps();
  for (int64_t j = 0; j < h; j += 16) ss = _mm512_fmadd_ps(_mm512_loadu_ps(buf + j), _mm512_loadu_ps(buf + j), ss);
  const __m512 inv = _mm512_set1_ps(1.f / std::sqrt(_mm512_reduce_add_ps(ss) / h + eps));
  for (int64_t j = 0; j < h; j += 16) {
    store16(out + j, _mm512_mul_ps(_mm512_mul_ps(_mm512_loadu_ps(buf + j), inv), load16(w + j)));
  }
}

template <typename T>
void rms_norm_rows(const T* x, T* res, const T* w, int64_t t, int64_t h, float eps, T* out) {
  at::parallel_for(0, t, 8, [&](int64_t r0, int64_t r1) {
    std::vector<float> buf(h);
    for (int64_t r = r0; r < r1; ++r) {
      for (int64_t j = 0; j < h; j += 16) {
        __m512 v = load16(x + r * h + j);
        if (res != nullptr) {  // residual <- x + residual (rounded to T, as torch's add), normed from there
          store16(res + r * h + j, _mm512_add_ps(v, load16(res + r * h + j)));
          v = load16(res + r * h + j);
        }
        _mm512_storeu_ps(buf.data() + j, v);
      }
      norm_row(buf.data(), w, h, eps, out + r * h);
    }
  });
}

void check_rows(const at::Tensor& x, const at::Tensor& w) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && x.size(1) % 16 == 0,
              "x must be a contiguous [T, H] tensor with H a multiple of 16");
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16, "x must be float32 or bfloat16");
  TORCH_CHECK(w.dim() == 1 && w.size(0) == x.size(1) && w.scalar_type() == x.scalar_type() && w.is_contiguous(),
              "weight must be [H] in x's dtype");
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& w, double eps) {
  check_rows(x, w);
  at::Tensor out = at::empty_like(x);
  dispatch_float_bf16(x, [&](auto* tag) {
    using scalar_t = std::remove_pointer_t<decltype(tag)>;
    rms_norm_rows<scalar_t>(x.data_ptr<scalar_t>(), nullptr, w.data_ptr<scalar_t>(), x.size(0), x.size(1),
                            static_cast<float>(eps), out.data_ptr<scalar_t>());
  });
  return out;
}

// residual += x in place, then -> rms_norm(residual).
at::Tensor add_rms_norm_(const at::Tensor& x, at::Tensor& residual, const at::Tensor& w, double eps) {
  check_rows(x, w);
  TORCH_CHECK(residual.sizes() == x.sizes() && residual.scalar_type() == x.scalar_type() && residual.is_contiguous(),
              "residual must be a contiguous tensor of x's shape and dtype");
  at::Tensor out = at::empty_like(x);
  dispatch_float_bf16(x, [&](auto* tag) {
    using scalar_t = std::remove_pointer_t<decltype(tag)>;
    rms_norm_rows<scalar_t>(x.data_ptr<scalar_t>(), residual.data_ptr<scalar_t>(), w.data_ptr<scalar_t>(),
                            x.size(0), x.size(1), static_cast<float>(eps), out.data_ptr<scalar_t>());
  });
  return out;
}

// gate_up [T, 2I] (gate first) -> silu(gate) * up [T, I]; silu rounded to x's dtype before the product,
// as torch's two ops do.
at::Tensor silu_mul(const at::Tensor& gate_up) {
  TORCH_CHECK(gate_up.dim() == 2 && gate_up.is_contiguous() && gate_up.size(1) % 32 == 0,
              "gate_up must be a contiguous [T, 2I] tensor with I a multiple of 16");
  TORCH_CHECK(gate_up.scalar_type() == at::kFloat || gate_up.scalar_type() == at::kBFloat16,
              "gate_up must be float32 or bfloat16");
  const int64_t t = gate_up.size(0), inter = gate_up.size(1) / 2;
  at::Tensor out = at::empty({t, inter}, gate_up.options());
  dispatch_float_bf16(gate_up, [&](auto* tag) {
    using scalar_t = std::remove_pointer_t<decltype(tag)>;
    const scalar_t* in = gate_up.data_ptr<scalar_t>();
    scalar_t* o = out.data_ptr<scalar_t>();
    at::parallel_for(0, t, 4, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        for (int64_t j = 0; j < inter; j += 16) {
          const __m512 g = load16(in + r * 2 * inter + j);
          const __m512 den = _mm512_add_ps(_mm512_set1_ps(1.f), exp16(_mm512_sub_ps(_mm512_setzero_ps(), g)));
          __m512 act = _mm512_div_ps(g, den);
          if constexpr (std::is_same_v<scalar_t, at::BFloat16>) act = round_bf16(act);  // torch rounds silu's output
          store16(o + r * inter + j, _mm512_mul_ps(act, load16(in + r * 2 * inter + inter + j)));
        }
      }
    });
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(radixlm_cpu, m) {
  m.def("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor");
  m.def("add_rms_norm_(Tensor x, Tensor(a!) residual, Tensor weight, float eps) -> Tensor");
  m.def("silu_mul(Tensor gate_up) -> Tensor");
}

TORCH_LIBRARY_IMPL(radixlm_cpu, CPU, m) {
  m.impl("rms_norm", &rms_norm);
  m.impl("add_rms_norm_", &add_rms_norm_);
  m.impl("silu_mul", &silu_mul);
}
