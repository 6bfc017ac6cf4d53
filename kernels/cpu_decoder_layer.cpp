// One Llama decoder layer as one op, from radixlm's CPU kernels, for the quantized models on the CPU: eager
// decode ran ~25 torch ops a layer (several hundred a token, each with Python and dispatch around it),
// which cost more than the matmuls themselves. Here a layer is one call; the kernels it runs are the ops
// of cpu_quant_matmul, cpu_decode_attention and cpu_norm_act, plus the rotary embedding and KV store of
// cpu_rope_body.h. Python reference: runtime/model/llama.py (the same math with torch's ops).
//
// x [T, H] (the previous layer's output; zeros before the first), residual [T, H] updated in place;
// weights: norm1 [H], qkv (data, scales, mins), qkv bias (or empty), o (3), norm2 [H], gate_up (3), down (3)
// with int4 (bits 4: codes, d, mn) or int8 (bits 8: q, s, unused) layouts; cos, sin [T, D / 2] float32;
// k_cache, v_cache one layer's head-major pools [Hkv, S, D]; loc [T] slots of the new tokens. Attention:
// decode (ext_lens empty) over rows = idx [B, Ls] with lens = counts [B]; extend over rows = the requests'
// slot rows [R, L], lens = seq_lens [R], ext_lens [R]. -> the layer's output [T, H].
#include "cpu_isa.h"
#include "cpu_ops.h"

#define RADIXLM_BODY "cpu_rope_body.h"
#include "cpu_foreach_isa.h"

namespace radixlm_cpu {
namespace {

constexpr int kWeights = 15;

at::Tensor linear(const at::Tensor& x, at::TensorList w, int64_t first, int64_t bits, int64_t isa) {
  return bits == 4 ? int4_linear(x, w[first], w[first + 1], w[first + 2], isa) : int8_linear(x, w[first], w[first + 1], isa);
}

// q rotated [T, Hq, D]; k rotated and v stored into the pools.
at::Tensor rope_store(const at::Tensor& qkv, int64_t hq, const at::Tensor& cos, const at::Tensor& sin,
                      at::Tensor& k_cache, at::Tensor& v_cache, const at::Tensor& loc, int64_t isa) {
  const int64_t t = qkv.size(0), hkv = k_cache.size(0), d = k_cache.size(2);
  at::Tensor q = at::empty({t, hq, d}, qkv.options());
  dispatch_float_bf16(qkv, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const T* src = qkv.data_ptr<T>();
    T* qd = q.data_ptr<T>();
    T* kd = k_cache.data_ptr<T>();
    T* vd = v_cache.data_ptr<T>();
    const float* cd = cos.data_ptr<float>();
    const float* sd = sin.data_ptr<float>();
    const int64_t* ld = loc.data_ptr<int64_t>();
    const int64_t stride = k_cache.stride(0);
    at::parallel_for(0, t, 4, [&](int64_t t0, int64_t t1) {
      if (d == 64) {
        RADIXLM_ISA_CALL(isa, rope_store_rows<4>, src, t0, t1, hq, hkv, cd, sd, ld, qd, kd, vd, stride);
      } else {
        RADIXLM_ISA_CALL(isa, rope_store_rows<8>, src, t0, t1, hq, hkv, cd, sd, ld, qd, kd, vd, stride);
      }
    });
  });
  return q;
}

void check_layer(const at::Tensor& x, const at::Tensor& residual, at::TensorList w, int64_t bits, const at::Tensor& cos,
                 const at::Tensor& sin, const at::Tensor& k_cache, const at::Tensor& v_cache, const at::Tensor& loc,
                 int64_t num_heads) {
  TORCH_CHECK(static_cast<int64_t>(w.size()) == kWeights, "weights: expected ", kWeights, " tensors, got ", w.size());
  TORCH_CHECK(bits == 4 || bits == 8, "bits must be 4 or 8, got ", bits);
  TORCH_CHECK(x.dim() == 2 && residual.sizes() == x.sizes() && residual.scalar_type() == x.scalar_type(),
              "x and residual must be [T, H] tensors of one dtype");
  const int64_t t = x.size(0), d = k_cache.size(2);
  TORCH_CHECK(k_cache.dim() == 3 && v_cache.sizes() == k_cache.sizes() && k_cache.is_contiguous() &&
              v_cache.is_contiguous() && k_cache.scalar_type() == x.scalar_type(),
              "k_cache and v_cache must be contiguous [Hkv, S, D] pools in x's dtype");
  TORCH_CHECK(d == 64 || d == 128, "head dim must be 64 or 128, got ", d);
  TORCH_CHECK(num_heads % k_cache.size(0) == 0, "query heads must be a multiple of KV heads");
  TORCH_CHECK(cos.sizes() == sin.sizes() && cos.dim() == 2 && cos.size(0) == t && cos.size(1) == d / 2 &&
              cos.scalar_type() == at::kFloat && cos.is_contiguous() && sin.is_contiguous(),
              "cos and sin must be contiguous float32 [T, D / 2]");
  TORCH_CHECK(loc.numel() == t && loc.scalar_type() == at::kLong && loc.is_contiguous(), "loc must be int64 [T]");
}

}  // namespace

at::Tensor decoder_layer(const at::Tensor& x, at::Tensor& residual, at::TensorList w, int64_t bits, double eps,
                         const at::Tensor& cos, const at::Tensor& sin, at::Tensor& k_cache, at::Tensor& v_cache,
                         const at::Tensor& loc, const at::Tensor& rows, const at::Tensor& lens,
                         const at::Tensor& ext_lens, int64_t num_heads, int64_t isa) {
  check_isa(isa);
  check_layer(x, residual, w, bits, cos, sin, k_cache, v_cache, loc, num_heads);
  const at::Tensor h = add_rms_norm_(x, residual, w[0], eps, isa);
  at::Tensor qkv = linear(h, w, 1, bits, isa);
  if (w[4].numel() > 0) qkv.add_(w[4]);
  const at::Tensor q = rope_store(qkv, num_heads, cos, sin, k_cache, v_cache, loc, isa);
  at::Tensor attn;
  if (ext_lens.numel() == 0) {
    const at::Tensor none = at::empty({0}, lens.options());
    attn = decode_attention(q, k_cache, v_cache, rows, lens, none, at::zeros({lens.numel()}, x.options().dtype(at::kBool)), isa);
  } else {
    attn = extend_attention(q, k_cache, v_cache, rows, lens, ext_lens, isa);
  }
  const at::Tensor h2 = add_rms_norm_(linear(attn, w, 5, bits, isa), residual, w[8], eps, isa);
  return linear(silu_mul(linear(h2, w, 9, bits, isa), isa), w, 12, bits, isa);
}

}  // namespace radixlm_cpu

TORCH_LIBRARY_FRAGMENT(radixlm_cpu, m) {
  m.def("decoder_layer(Tensor x, Tensor(a!) residual, Tensor[] weights, int bits, float eps, Tensor cos, Tensor sin, "
        "Tensor(b!) k_cache, Tensor(c!) v_cache, Tensor loc, Tensor rows, Tensor lens, Tensor ext_lens, int num_heads, "
        "int isa) -> Tensor");
}

TORCH_LIBRARY_IMPL(radixlm_cpu, CPU, m) { m.impl("decoder_layer", &radixlm_cpu::decoder_layer); }
