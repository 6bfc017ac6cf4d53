// Rotary embedding of a layer's fresh q and k, and the KV store, written once against the vector layer
// (compiled per instruction set by cpu_foreach_isa.h; used by cpu_decoder_layer.cpp).
//
// Rotate-half RoPE in float32, one rounding: with x = (x1, x2) the two halves of a head,
// out = (x1 cos - x2 sin, x2 cos + x1 sin); cos, sin [P, D / 2] float32 tables, row pos[t] for token t.

// row[j] (+ bias[j], rounded to S as torch's add is, when there is a bias) in float32
template <typename S, typename T>
inline F16 load_biased(const S* row, const T* bias, int64_t j) {
  if (bias == nullptr) return fload(row + j);
  const F16 v = add(fload(row + j), fload(bias + j));
  if constexpr (std::is_same_v<S, at::BFloat16>) return round_bf16(v);
  return v;
}

// Tokens [t0, t1) of qkv [T, (Hq + 2 Hkv) D] (+ bias [(Hq + 2 Hkv) D], or null), heads [h0, h1) of the Hq
// query heads then the Hkv KV heads: a query head rotated into q_out [T, Hq, D]; a KV head's k rotated and v
// copied into the head-major pools (head stride head_stride) at slot loc[t]. A head's result depends on
// nothing else. DC = D / 16. qkv in T, or (the fused quantized layers' activations) float32 S; the outputs in T.
template <int DC, typename T, typename S = T>
void rope_store_rows(const S* qkv, const T* bias, int64_t t0, int64_t t1, int64_t h0, int64_t h1, int64_t hq,
                     int64_t hkv, const float* cos, const float* sin, const int64_t* pos, const int64_t* loc,
                     T* q_out, T* k_cache, T* v_cache, int64_t head_stride) {
  constexpr int D = DC * 16, HALF = D / 2;
  const int64_t width = (hq + 2 * hkv) * D;
  for (int64_t t = t0; t < t1; ++t) {
    const S* row = qkv + t * width;
    const float* c = cos + pos[t] * HALF;
    const float* s = sin + pos[t] * HALF;
    auto rotate = [&](int64_t col, T* out) {  // the head at column col
      for (int j = 0; j < HALF; j += 16) {
        const F16 x1 = load_biased(row, bias, col + j), x2 = load_biased(row, bias, col + HALF + j);
        const F16 cj = fload(c + j), sj = fload(s + j);
        fstore(out + j, fmadd(x1, cj, mul(sub(fzero(), x2), sj)));
        fstore(out + HALF + j, fmadd(x2, cj, mul(x1, sj)));
      }
    };
    for (int64_t h = h0; h < std::min(h1, hq); ++h) rotate(h * D, q_out + (t * hq + h) * D);
    for (int64_t h = std::max<int64_t>(h0 - hq, 0); h < h1 - hq; ++h) {
      rotate((hq + h) * D, k_cache + h * head_stride + loc[t] * D);
      const int64_t col = (hq + hkv + h) * D;
      T* dst = v_cache + h * head_stride + loc[t] * D;
      for (int j = 0; j < D; j += 16) fstore(dst + j, load_biased(row, bias, col + j));
    }
  }
}
