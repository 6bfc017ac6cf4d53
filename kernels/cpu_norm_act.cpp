// The prefill's elementwise ops, one pass each: RMSNorm (optionally after the residual add) and SwiGLU's
// silu(gate) * up; torch's CPU ops take several passes in bfloat16. The compiled decode step gets the same
// fusion from inductor and keeps torch's ops. Torch references: cpu_norm_act.py; body: cpu_norm_act_body.h.
//
// x, residual [T, H], weight [H] in x's dtype (float32 or bfloat16), computed in float32 and rounded once.
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

void norm(const at::Tensor& x, at::Tensor* residual, const at::Tensor& w, double eps, at::Tensor& out, int64_t isa) {
  dispatch_float_bf16(x, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const T* xd = x.data_ptr<T>();
    T* rd = residual != nullptr ? residual->data_ptr<T>() : nullptr;
    const T* wd = w.data_ptr<T>();
    T* od = out.data_ptr<T>();
    const int64_t h = x.size(1);
    at::parallel_for(0, x.size(0), 8, [&](int64_t r0, int64_t r1) {
      RADIXLM_ISA_CALL(isa, rms_norm_rows<T>, xd, rd, wd, r0, r1, h, static_cast<float>(eps), od);
    });
  });
}

}  // namespace

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& w, double eps, int64_t isa) {
  check_isa(isa);
  check_rows(x, w);
  at::Tensor out = at::empty_like(x);
  norm(x, nullptr, w, eps, out, isa);
  return out;
}

// residual += x in place, then -> rms_norm(residual).
at::Tensor add_rms_norm_(const at::Tensor& x, at::Tensor& residual, const at::Tensor& w, double eps, int64_t isa) {
  check_isa(isa);
  check_rows(x, w);
  TORCH_CHECK(residual.sizes() == x.sizes() && residual.scalar_type() == x.scalar_type() && residual.is_contiguous(),
              "residual must be a contiguous tensor of x's shape and dtype");
  at::Tensor out = at::empty_like(x);
  norm(x, &residual, w, eps, out, isa);
  return out;
}

// gate_up [T, 2I] (gate first) -> silu(gate) * up [T, I].
at::Tensor silu_mul(const at::Tensor& gate_up, int64_t isa) {
  check_isa(isa);
  TORCH_CHECK(gate_up.dim() == 2 && gate_up.is_contiguous() && gate_up.size(1) % 32 == 0,
              "gate_up must be a contiguous [T, 2I] tensor with I a multiple of 16");
  TORCH_CHECK(gate_up.scalar_type() == at::kFloat || gate_up.scalar_type() == at::kBFloat16,
              "gate_up must be float32 or bfloat16");
  const int64_t t = gate_up.size(0), inter = gate_up.size(1) / 2;
  at::Tensor out = at::empty({t, inter}, gate_up.options());
  dispatch_float_bf16(gate_up, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const T* in = gate_up.data_ptr<T>();
    T* o = out.data_ptr<T>();
    at::parallel_for(0, t, 4, [&](int64_t r0, int64_t r1) { RADIXLM_ISA_CALL(isa, silu_mul_rows<T>, in, r0, r1, inter, o); });
  });
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
