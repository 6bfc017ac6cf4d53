// The grammar bitmask applied to one float32 logits row, written once against the vector layer.
// Bit j of word w allows token 32 w + j; a disallowed token, and every token past the mask's width,
// becomes -inf; allowed tokens keep their logit. Whole runs of 16 take plain loads and stores (the masked
// ones are slow on some CPUs: microcoded on AMD Zen 1 and 2), and are skipped where all 16 are allowed.
inline void mask_row(float* row, const int32_t* words, int64_t vocab, int64_t width) {
  const float neg_inf = -std::numeric_limits<float>::infinity();
  const int64_t covered = std::min(vocab, width);
  int64_t t = 0;
  for (; t + 16 <= covered; t += 16) {
    const uint32_t word = static_cast<uint32_t>(words[t / 32]);
    const uint32_t allow = (t % 32) ? word >> 16 : word & 0xFFFF;
    if (allow == 0xFFFF) continue;
    fstore(row + t, allow == 0 ? fset1(neg_inf) : select_bits(fload(row + t), ~allow & 0xFFFF, neg_inf));
  }
  if (t < covered) {
    const uint32_t word = static_cast<uint32_t>(words[t / 32]);
    const uint32_t allow = (t % 32) ? word >> 16 : word & 0xFFFF;
    const int64_t n = covered - t;
    fstore_n(row + t, select_bits(fload_n(row + t, n), ~allow & 0xFFFF, neg_inf), n);
  }
  for (t = covered; t < vocab; ++t) row[t] = neg_inf;
}
