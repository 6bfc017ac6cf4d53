// The prefill's elementwise ops, one pass each: RMSNorm (optionally after the residual add) and SwiGLU's
// silu(gate) * up; torch's CPU ops take several passes in bfloat16. The compiled decode step gets the same
// fusion from inductor and keeps torch's ops. Torch references: cpu_norm_act.py; body: cpu_norm_act_body.h.
//
// x [T, H], weight [H] in x's dtype (float32 or bfloat16), residual [T, H] in x's dtype or float32; computed in
// float32 and rounded once.
#include "cpu_isa.h"
#include "cpu_ops.h"

#define RADIXLM_BODY "cpu_norm_act_body.h"
#include "cpu_foreach_isa.h"

namespace radixlm_cpu {
namespace {

void check_rows(const at::Tensor& x, const at::Tensor& w) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && x.size(1) % 16 == 0,
              "x must be a contiguous [T, H] tensor with H a multiple of 16");
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16, "x must be float32 or bfloat16");
  TORCH_CHECK(w.dim() == 1 && w.size(0) == x.size(1) && w.scalar_type() == x.scalar_type() && w.is_contiguous(),
              "weight must be [H] in x's dtype");
}

at::Tensor norm(const at::Tensor& x, at::Tensor* residual, const at::Tensor& w, double eps, int64_t isa) {
  at::Tensor out = at::empty_like(x);
  at::parallel_for(0, x.size(0), 8, [&](int64_t r0, int64_t r1) { rms_norm_range(x, residual, w, eps, r0, r1, out, isa); });
  return out;
}

}  // namespace

void rms_norm_range(const at::Tensor& x, at::Tensor* residual, const at::Tensor& w, double eps, int64_t r0, int64_t r1,
                    at::Tensor& out, int64_t isa) {
  dispatch_float_bf16(w, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    auto call = [&](auto* xd, auto* rd, auto* od) {
      RADIXLM_ISA_CALL(isa, rms_norm_rows, xd, rd, w.data_ptr<T>(), r0, r1, x.size(1), static_cast<float>(eps), od);
    };
    auto rows = [&](auto* xd, auto* od) {  // the residual: none, float32 or the weight's dtype
      if (residual == nullptr) return call(xd, static_cast<T*>(nullptr), od);
      if (residual->scalar_type() == at::kFloat) return call(xd, residual->data_ptr<float>(), od);
      call(xd, residual->data_ptr<T>(), od);
    };
    auto to = [&](auto* xd) {  // out in the weight's dtype or float32
      out.scalar_type() == at::kFloat ? rows(xd, out.data_ptr<float>()) : rows(xd, out.data_ptr<T>());
    };
    x.scalar_type() == at::kFloat ? to(x.data_ptr<float>()) : to(x.data_ptr<T>());
  });
}

void silu_mul_range(const at::Tensor& gate_up, int64_t r0, int64_t r1, int64_t j0, int64_t j1, at::Tensor& out,
                    int64_t isa) {
  dispatch_float_bf16(gate_up, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    RADIXLM_ISA_CALL(isa, silu_mul_rows<T>, gate_up.data_ptr<T>(), r0, r1, j0, j1, gate_up.size(1) / 2,
                     out.data_ptr<T>());
  });
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& w, double eps, int64_t isa) {
  check_isa(isa);
  check_rows(x, w);
  return norm(x, nullptr, w, eps, isa);
}

// residual += x in place, then -> rms_norm(residual).
at::Tensor add_rms_norm_(const at::Tensor& x, at::Tensor& residual, const at::Tensor& w, double eps, int64_t isa) {
  check_isa(isa);
  check_rows(x, w);
  TORCH_CHECK(residual.sizes() == x.sizes() && residual.is_contiguous() &&
                  (residual.scalar_type() == x.scalar_type() || residual.scalar_type() == at::kFloat),
              "residual must be a contiguous tensor of x's shape, in x's dtype or float32");
  return norm(x, &residual, w, eps, isa);
}

// gate_up [T, 2I] (gate first) -> silu(gate) * up [T, I].
at::Tensor silu_mul(const at::Tensor& gate_up, int64_t isa) {
  check_isa(isa);
  TORCH_CHECK(gate_up.dim() == 2 && gate_up.is_contiguous() && gate_up.size(1) % 32 == 0,
              "gate_up must be a contiguous [T, 2I] tensor with I a multiple of 16");
  TORCH_CHECK(gate_up.scalar_type() == at::kFloat || gate_up.scalar_type() == at::kBFloat16,
              "gate_up must be float32 or bfloat16");
  at::Tensor out = at::empty({gate_up.size(0), gate_up.size(1) / 2}, gate_up.options());
  const int64_t inter = out.size(1);
  at::parallel_for(0, gate_up.size(0), 4,
                   [&](int64_t r0, int64_t r1) { silu_mul_range(gate_up, r0, r1, 0, inter, out, isa); });
  return out;
}

}  // namespace radixlm_cpu

TORCH_LIBRARY_FRAGMENT(radixlm_cpu, m) {
  m.def("rms_norm(Tensor x, Tensor weight, float eps, int isa) -> Tensor");
  m.def("add_rms_norm_(Tensor x, Tensor(a!) residual, Tensor weight, float eps, int isa) -> Tensor");
  m.def("silu_mul(Tensor gate_up, int isa) -> Tensor");
}

TORCH_LIBRARY_IMPL(radixlm_cpu, CPU, m) {
  m.impl("rms_norm", &radixlm_cpu::rms_norm);
  m.impl("add_rms_norm_", &radixlm_cpu::add_rms_norm_);
  m.impl("silu_mul", &radixlm_cpu::silu_mul);
}
