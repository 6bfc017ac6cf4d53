// One Llama decoder layer as one op, from radixlm's CPU kernels, for the quantized models on the CPU: eager
// decode ran ~25 torch ops a layer (several hundred a token, each with Python and dispatch around it),
// which cost more than the matmuls themselves. Here a layer is one call; the kernels it runs are the ops
// of cpu_matmul, cpu_decode_attention and cpu_norm_act, plus the rotary embedding and KV store of
// cpu_rope_body.h. Python reference: runtime/model/llama.py (the same math with torch's ops).
//
// x [T, H] (the previous layer's output: the embeddings before the first, with residual zeros), overwritten
// by this layer's output and returned; residual [T, H] updated in place; workspace a uint8 tensor the op
// grows to what its buffers need (kept by the caller across calls);
// weights: norm1 [H], qkv (data, scales, mins), qkv bias (or empty), o (3), norm2 [H], gate_up (3), down (3)
// in cpu_matmul's int4 (bits 4: codes, d, mn or empty), int8 (bits 8: q, s, unused) or dense (bits 16:
// tiles, unused, unused) layouts; cos, sin [T, D / 2] float32;
// k_cache, v_cache one layer's head-major pools [Hkv, S, D]; loc [T] slots of the new tokens. Attention:
// decode (ext_lens empty) over rows = idx [B, Ls] with lens = counts [B]; extend over rows = the requests'
// slot rows [R, L], lens = seq_lens [R], ext_lens [R].
#include "cpu_isa.h"
#include "cpu_ops.h"

#include <omp.h>

#include <array>
#include <iterator>

#define RADIXLM_BODY "cpu_rope_body.h"
#include "cpu_foreach_isa.h"

namespace radixlm_cpu {
namespace {

constexpr int kWeights = 15;

// Tokens [t0, t1): q rotated into q [T, Hq, D]; k rotated and v stored into the pools.
void rope_store_range(const at::Tensor& qkv, const at::Tensor& cos, const at::Tensor& sin, at::Tensor& k_cache,
                      at::Tensor& v_cache, const at::Tensor& loc, int64_t t0, int64_t t1, at::Tensor& q, int64_t isa) {
  const int64_t hq = q.size(1), hkv = k_cache.size(0), d = k_cache.size(2), stride = k_cache.stride(0);
  dispatch_float_bf16(qkv, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const T* src = qkv.data_ptr<T>();
    const float* cd = cos.data_ptr<float>();
    const float* sd = sin.data_ptr<float>();
    const int64_t* ld = loc.data_ptr<int64_t>();
    T *qd = q.data_ptr<T>(), *kd = k_cache.data_ptr<T>(), *vd = v_cache.data_ptr<T>();
    if (d == 64) {
      RADIXLM_ISA_CALL(isa, rope_store_rows<4>, src, t0, t1, hq, hkv, cd, sd, ld, qd, kd, vd, stride);
    } else {
      RADIXLM_ISA_CALL(isa, rope_store_rows<8>, src, t0, t1, hq, hkv, cd, sd, ld, qd, kd, vd, stride);
    }
  });
}

void check_layer(const at::Tensor& x, const at::Tensor& residual, at::TensorList w, int64_t bits, const at::Tensor& cos,
                 const at::Tensor& sin, const at::Tensor& k_cache, const at::Tensor& v_cache, const at::Tensor& loc,
                 int64_t num_heads) {
  TORCH_CHECK(static_cast<int64_t>(w.size()) == kWeights, "weights: expected ", kWeights, " tensors, got ", w.size());
  TORCH_CHECK(bits == 4 || bits == 8 || bits == 16, "bits must be 4, 8 or 16 (dense), got ", bits);
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && residual.sizes() == x.sizes() && residual.is_contiguous() &&
              residual.scalar_type() == x.scalar_type() && x.size(1) % 64 == 0,
              "x and residual must be contiguous [T, H] tensors of one dtype, H a multiple of 64");
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16, "x must be float32 or bfloat16");
  const int64_t t = x.size(0), d = k_cache.size(2);
  TORCH_CHECK(k_cache.dim() == 3 && v_cache.sizes() == k_cache.sizes() && k_cache.is_contiguous() &&
              v_cache.is_contiguous() && k_cache.scalar_type() == x.scalar_type(),
              "k_cache and v_cache must be contiguous [Hkv, S, D] pools in x's dtype");
  TORCH_CHECK(d == 64 || d == 128, "head dim must be 64 or 128, got ", d);
  TORCH_CHECK(num_heads % k_cache.size(0) == 0 && num_heads / k_cache.size(0) <= 16,
              "query heads must be 1-16 per KV head");
  TORCH_CHECK(cos.sizes() == sin.sizes() && cos.dim() == 2 && cos.size(0) == t && cos.size(1) == d / 2 &&
              cos.scalar_type() == at::kFloat && cos.is_contiguous() && sin.is_contiguous(),
              "cos and sin must be contiguous float32 [T, D / 2]");
  TORCH_CHECK(loc.numel() == t && loc.scalar_type() == at::kLong && loc.is_contiguous(), "loc must be int64 [T]");
  TORCH_CHECK(w[0].sizes() == w[8].sizes() && w[0].numel() == x.size(1) && w[0].scalar_type() == x.scalar_type(),
              "norm weights must be [H] in x's dtype");
}

// The part [b, e) of count items that thread `tid` of `nt` takes.
std::pair<int64_t, int64_t> share(int64_t count, int tid, int nt) {
  const int64_t per = (count + nt - 1) / nt, b = std::min(count, tid * per);
  return {b, std::min(count, b + per)};
}

}  // namespace

// One parallel region for the whole layer: its phases are split over the threads with a barrier between
// them (a region started per phase cost more than several of its kernels at batch 1).
at::Tensor decoder_layer(at::Tensor& x, at::Tensor& residual, at::TensorList w, int64_t bits, double eps,
                         const at::Tensor& cos, const at::Tensor& sin, at::Tensor& k_cache, at::Tensor& v_cache,
                         const at::Tensor& loc, const at::Tensor& rows, const at::Tensor& lens,
                         const at::Tensor& ext_lens, int64_t num_heads, at::Tensor& workspace, int64_t isa) {
  check_isa(isa);
  check_layer(x, residual, w, bits, cos, sin, k_cache, v_cache, loc, num_heads);
  TORCH_CHECK(workspace.dim() == 1 && workspace.scalar_type() == at::kByte, "workspace must be a uint8 vector");
  const QuantWeightRef qkv_w{bits, w[1], w[2], w[3]}, o_w{bits, w[5], w[6], w[7]}, gu_w{bits, w[9], w[10], w[11]},
      down_w{bits, w[12], w[13], w[14]};
  for (const QuantWeightRef* wt : {&qkv_w, &o_w, &gu_w, &down_w}) {
    check_weight(*wt);
    TORCH_CHECK(bits != 16 || wt->data.scalar_type() == x.scalar_type(), "dense weights must be in x's dtype");
  }
  const int64_t t = x.size(0), hidden = x.size(1), d = k_cache.size(2);
  TORCH_CHECK(qkv_w.k() == hidden && qkv_w.n() == (num_heads + 2 * k_cache.size(0)) * d && o_w.k() == num_heads * d &&
              o_w.n() == hidden && gu_w.k() == hidden && down_w.n() == hidden && down_w.k() * 2 == gu_w.n(),
              "weights: shapes disagree with the model");
  // every buffer of the layer in one workspace, grown when a batch needs more; out is x itself (x is read
  // in the first phase only)
  const int64_t elem = x.element_size(), qkv_n = qkv_w.n(), q_n = num_heads * d, inter = down_w.k();
  const int64_t sizes[] = {t * hidden * elem, t * qkv_n * elem, t * q_n * elem, t * q_n * elem, t * hidden * elem,
                           t * hidden * elem, t * gu_w.n() * elem, t * inter * elem, Activations::bytes(t, hidden, bits),
                           Activations::bytes(t, q_n, bits), Activations::bytes(t, hidden, bits),
                           Activations::bytes(t, inter, bits)};
  int64_t total = 64;
  for (int64_t n : sizes) total += QuantizedX::aligned(n);
  if (workspace.numel() < total) workspace.resize_({total});
  char* base = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(workspace.data_ptr<uint8_t>()) + 63) / 64 * 64);
  std::array<char*, std::size(sizes)> buf;
  for (size_t i = 0; i < buf.size(); ++i) {
    buf[i] = base;
    base += QuantizedX::aligned(sizes[i]);
  }
  const auto opts = x.options();
  auto view = [&](int i, at::IntArrayRef shape) { return at::from_blob(buf[i], shape, opts); };
  at::Tensor h = view(0, {t, hidden}), qkv = view(1, {t, qkv_n}), q = view(2, {t, num_heads, d});
  at::Tensor attn = view(3, {t, q_n}), o = view(4, {t, hidden}), h2 = view(5, {t, hidden});
  at::Tensor gu = view(6, {t, gu_w.n()}), act = view(7, {t, inter});
  at::Tensor out = x;
  const Activations xh = Activations::at(buf[8], t, hidden, bits), xattn = Activations::at(buf[9], t, q_n, bits);
  const Activations xh2 = Activations::at(buf[10], t, hidden, bits), xact = Activations::at(buf[11], t, inter, bits);
  const bool decode = ext_lens.numel() == 0;
  const std::vector<AttentionTask> tasks = decode ? decode_tasks(q, k_cache, rows, lens, at::Tensor(), at::Tensor())
                                                  : extend_tasks(q, k_cache, rows, lens, ext_lens);
  const bool has_bias = w[4].numel() > 0;
#pragma omp parallel num_threads(at::get_num_threads())
  {
    const int tid = omp_get_thread_num(), nt = omp_get_num_threads();
    Scratch scratch;
    auto [r0, r1] = share(t, tid, nt);
    auto tiles = [&](const QuantWeightRef& wt, const Activations& xq, at::Tensor& y) {
      auto [b, e] = share(wt.n() / 16, tid, nt);
      if (b < e) linear_tiles(wt, xq, b, e, y, isa);
    };
    if (r0 < r1) {
      rms_norm_range(x, &residual, w[0], eps, r0, r1, h, isa);
      prepare_range(h, r0, r1, xh, bits, isa);
    }
#pragma omp barrier
    tiles(qkv_w, xh, qkv);
#pragma omp barrier
    if (r0 < r1) {
      if (has_bias) qkv.narrow(0, r0, r1 - r0).add_(w[4]);
      rope_store_range(qkv, cos, sin, k_cache, v_cache, loc, r0, r1, q, isa);
    }
#pragma omp barrier
    auto [a0, a1] = share(static_cast<int64_t>(tasks.size()), tid, nt);
    if (a0 < a1) run_attention(tasks, q, k_cache, v_cache, attn, a0, a1, scratch, isa);
#pragma omp barrier
    if (r0 < r1) prepare_range(attn, r0, r1, xattn, bits, isa);
#pragma omp barrier
    tiles(o_w, xattn, o);
#pragma omp barrier
    if (r0 < r1) {
      rms_norm_range(o, &residual, w[8], eps, r0, r1, h2, isa);
      prepare_range(h2, r0, r1, xh2, bits, isa);
    }
#pragma omp barrier
    tiles(gu_w, xh2, gu);
#pragma omp barrier
    if (r0 < r1) {
      silu_mul_range(gu, r0, r1, act, isa);
      prepare_range(act, r0, r1, xact, bits, isa);
    }
#pragma omp barrier
    tiles(down_w, xact, out);
  }
  return out;
}

}  // namespace radixlm_cpu

TORCH_LIBRARY_FRAGMENT(radixlm_cpu, m) {
  m.def("decoder_layer(Tensor(a!) x, Tensor(b!) residual, Tensor[] weights, int bits, float eps, Tensor cos, "
        "Tensor sin, Tensor(c!) k_cache, Tensor(d!) v_cache, Tensor loc, Tensor rows, Tensor lens, Tensor ext_lens, "
        "int num_heads, Tensor(e!) workspace, int isa) -> Tensor(a!)");
}

TORCH_LIBRARY_IMPL(radixlm_cpu, CPU, m) { m.impl("decoder_layer", &radixlm_cpu::decoder_layer); }
