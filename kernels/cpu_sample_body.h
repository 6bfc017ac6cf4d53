// The sampler's exponentials, written once against the vector layer (compiled per instruction set by
// cpu_foreach_isa.h; the op is in cpu_sample.cpp). For columns [c0, c1) of one row of n logits (c0 a multiple of
// 256), scale = 1 / temperature and m the largest logit times scale: e[j] = exp(row[j] * scale - m), in (0, 1],
// and per block b of 256 columns (16 vectors, the last one's columns past n counting 0) their sum and largest
// value, bsum[b] and bmax[b]. fexp clamps its argument below at -87, so a -inf logit gets about 1.6e-38, not 0:
// the op treats any e below its kNegligible as 0.
inline void exp_blocks(const float* row, float scale, float m, int64_t c0, int64_t c1, int64_t n, float* e,
                       float* bsum, float* bmax) {
  const F16 s = fset1(scale), top = fset1(m);
  for (int64_t b0 = c0; b0 < c1; b0 += 256) {
    F16 sum = fzero(), mx = fzero();
    for (int64_t j = b0; j < std::min(b0 + 256, n); j += 16) {
      const int64_t k = std::min<int64_t>(16, n - j);
      F16 v = fexp(sub(mul(k == 16 ? fload(row + j) : fload_n(row + j, k), s), top));
      if (k == 16) {
        fstore(e + j, v);
      } else {
        v = keep_first(v, k);
        fstore_n(e + j, v, k);
      }
      sum = add(sum, v);
      mx = fmax(v, mx);
    }
    bsum[b0 / 256] = reduce_add(sum);
    bmax[b0 / 256] = reduce_max(mx);
  }
}
