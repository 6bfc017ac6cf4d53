// radixlm's C++ CPU ops as C++ functions, for the ops built from them (the fused decoder layer). Each is
// registered as torch.ops.radixlm_cpu.<name> by its own file; isa is the kernel path (cpu_isa.h).
#pragma once

#include <ATen/ATen.h>

namespace radixlm_cpu {

at::Tensor int4_linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& d, const at::Tensor& mn, int64_t isa);
at::Tensor int8_linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& s, int64_t isa);
at::Tensor decode_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& idx,
                            const at::Tensor& counts, const at::Tensor& prefix, const at::Tensor& member, int64_t isa);
at::Tensor extend_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& table,
                            const at::Tensor& seq_lens, const at::Tensor& ext_lens, int64_t isa);
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& w, double eps, int64_t isa);
at::Tensor add_rms_norm_(const at::Tensor& x, at::Tensor& residual, const at::Tensor& w, double eps, int64_t isa);
at::Tensor silu_mul(const at::Tensor& gate_up, int64_t isa);

}  // namespace radixlm_cpu
