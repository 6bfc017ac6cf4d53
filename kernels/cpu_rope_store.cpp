// The rotary embedding and KV store of the fused decoder layers (cpu_decoder_layer.cpp), for a thread's cells
// of a batch: the body (cpu_rope_body.h) for every instruction set, and how the cells split over threads.
// Python reference: runtime/model/llama.py (RoPE then the pools' store, with torch's ops).
#include "cpu_isa.h"
#include "cpu_ops.h"

#include <cmath>

#define RADIXLM_BODY "cpu_rope_body.h"
#include "cpu_foreach_isa.h"

namespace radixlm_cpu {

// (cpu_ops.h.) No torch op: this runs on the region's threads, where torch's thread-local state (inference mode)
// is not the caller's.
void rope_store_range(const at::Tensor& qkv, const at::Tensor& bias, const at::Tensor& cos, const at::Tensor& sin,
                      const at::Tensor& pos, at::Tensor& k_cache, at::Tensor& v_cache, const at::Tensor& loc,
                      const CellPart& p, at::Tensor& q, int64_t isa) {
  const int64_t hq = q.size(1), hkv = k_cache.size(0), d = k_cache.size(2), stride = k_cache.stride(0);
  dispatch_float_bf16(k_cache, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const T* bd = bias.numel() > 0 ? bias.data_ptr<T>() : nullptr;
    const float *cd = cos.data_ptr<float>(), *sd = sin.data_ptr<float>();
    const int64_t *ld = loc.data_ptr<int64_t>(), *pd = pos.data_ptr<int64_t>();
    T *qd = q.data_ptr<T>(), *kd = k_cache.data_ptr<T>(), *vd = v_cache.data_ptr<T>();
    auto rows = [&](auto* src) {  // qkv in the pools' dtype, or float32
      d == 64 ? RADIXLM_ISA_CALL(isa, rope_store_rows<4>, src, bd, p.r0, p.r1, p.u0, p.u1, hq, hkv, cd, sd, pd, ld, qd,
                                 kd, vd, stride)
              : RADIXLM_ISA_CALL(isa, rope_store_rows<8>, src, bd, p.r0, p.r1, p.u0, p.u1, hq, hkv, cd, sd, pd, ld, qd,
                                 kd, vd, stride);
    };
    qkv.scalar_type() == at::kFloat ? rows(qkv.data_ptr<float>()) : rows(qkv.data_ptr<T>());
  });
}

// Thread tid's cells of RoPE + KV store, units the Hq query heads then the Hkv KV heads of a row: whole rows when
// there is a row for every thread, else its part of every row's heads split by cost, a KV head counted as
// kKvHeadCost query heads (its k rotated and stored and its v stored: four pool lines a fresh slot has in no cache).
constexpr int64_t kKvHeadCost = 5;
CellPart rope_part(int64_t t, int64_t hq, int64_t hkv, int tid, int nt) {
  if (t >= nt) return cell_part(t, hq + hkv, tid, nt);
  auto cost = [&](int64_t u) { return std::min(u, hq) + kKvHeadCost * std::max<int64_t>(u - hq, 0); };
  auto first = [&](int i) {  // the unit boundary nearest i / nt of the total cost
    const int64_t want = i * cost(hq + hkv);
    int64_t best = 0;
    for (int64_t u = 1; u <= hq + hkv; ++u) {
      if (std::abs(nt * cost(u) - want) < std::abs(nt * cost(best) - want)) best = u;
    }
    return best;
  };
  return {0, t, first(tid), first(tid + 1)};
}

}  // namespace radixlm_cpu
