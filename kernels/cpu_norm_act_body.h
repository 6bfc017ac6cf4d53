// RMSNorm (optionally after the residual add) and silu(gate) * up, written once against the vector layer
// (compiled per instruction set by cpu_foreach_isa.h; the ops are in cpu_norm_act.cpp). Float32 math,
// one rounding to T at the end; a row's result depends on nothing but that row.

// out = x / sqrt(mean(x^2) + eps) * w for one row of h (a multiple of 16) float32 values in buf.
template <typename W, typename O>
void norm_row(const float* buf, const W* w, int64_t h, float eps, O* out) {
  F16 ss = fzero();
  for (int64_t j = 0; j < h; j += 16) ss = fmadd(fload(buf + j), fload(buf + j), ss);
  const F16 inv = fset1(1.f / std::sqrt(reduce_add(ss) / static_cast<float>(h) + eps));
  for (int64_t j = 0; j < h; j += 16) fstore(out + j, mul(mul(fload(buf + j), inv), fload(w + j)));
}

// rows [r0, r1) of x [T, H]; with res: res <- x + res (rounded to R: W as torch's add, or float32, the fused layers'
// residual stream), normed from there. x and out in the weight's dtype W, or (the fused quantized layers'
// activations) float32.
template <typename W, typename R, typename X = W, typename O = W>
void rms_norm_rows(const X* x, R* res, const W* w, int64_t r0, int64_t r1, int64_t h, float eps, O* out) {
  std::vector<float> buf(h);
  for (int64_t r = r0; r < r1; ++r) {
    for (int64_t j = 0; j < h; j += 16) {
      F16 v = fload(x + r * h + j);
      if (res != nullptr) {
        fstore(res + r * h + j, add(v, fload(res + r * h + j)));
        v = fload(res + r * h + j);
      }
      fstore(buf.data() + j, v);
    }
    norm_row(buf.data(), w, h, eps, out + r * h);
  }
}

// rows [r0, r1), columns [j0, j1) (multiples of 16) of gate_up [T, 2I] -> silu(gate) * up [T, I]; silu
// rounded to T before the product, as torch's two ops do.
template <typename T>
void silu_mul_rows(const T* in, int64_t r0, int64_t r1, int64_t j0, int64_t j1, int64_t inter, T* out) {
  for (int64_t r = r0; r < r1; ++r) {
    for (int64_t j = j0; j < j1; j += 16) {
      const F16 g = fload(in + r * 2 * inter + j);
      F16 act = div(g, add(fset1(1.f), fexp(sub(fzero(), g))));
      if constexpr (std::is_same_v<T, at::BFloat16>) act = round_bf16(act);
      fstore(out + r * inter + j, mul(act, fload(in + r * 2 * inter + inter + j)));
    }
  }
}
