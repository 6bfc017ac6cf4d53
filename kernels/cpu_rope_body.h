// Rotary embedding of a layer's fresh q and k, and the KV store, written once against the vector layer
// (compiled per instruction set by cpu_foreach_isa.h; used by cpu_decoder_layer.cpp).
//
// Rotate-half RoPE in float32, one rounding: with x = (x1, x2) the two halves of a head,
// out = (x1 cos - x2 sin, x2 cos + x1 sin); cos, sin [T, D / 2] float32 per token.

// Tokens [t0, t1) of qkv [T, (Hq + 2 Hkv) D]: q rotated into q_out [T, Hq, D]; k rotated and v copied into
// the head-major pools (head stride head_stride) at slot loc[t]. DC = D / 16.
template <int DC, typename T>
void rope_store_rows(const T* qkv, int64_t t0, int64_t t1, int64_t hq, int64_t hkv, const float* cos,
                     const float* sin, const int64_t* loc, T* q_out, T* k_cache, T* v_cache, int64_t head_stride) {
  constexpr int D = DC * 16, HALF = D / 2;
  const int64_t width = (hq + 2 * hkv) * D;
  for (int64_t t = t0; t < t1; ++t) {
    const T* row = qkv + t * width;
    const float* c = cos + t * HALF;
    const float* s = sin + t * HALF;
    auto rotate = [&](const T* x, T* out) {
      for (int j = 0; j < HALF; j += 16) {
        const F16 x1 = fload(x + j), x2 = fload(x + HALF + j), cj = fload(c + j), sj = fload(s + j);
        fstore(out + j, fmadd(x1, cj, mul(sub(fzero(), x2), sj)));
        fstore(out + HALF + j, fmadd(x2, cj, mul(x1, sj)));
      }
    };
    for (int64_t h = 0; h < hq; ++h) rotate(row + h * D, q_out + (t * hq + h) * D);
    for (int64_t h = 0; h < hkv; ++h) {
      rotate(row + (hq + h) * D, k_cache + h * head_stride + loc[t] * D);
      const T* v = row + (hq + hkv + h) * D;
      T* dst = v_cache + h * head_stride + loc[t] * D;
      for (int j = 0; j < D; j += 16) fstore(dst + j, fload(v + j));
    }
  }
}
