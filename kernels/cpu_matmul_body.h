// The matmul kernels, int2 / int3 / int4 (plain, K-quant, IQ4) / int5 / int6 / int8 weight-only and dense (bfloat16
// or float32 weights), written once against the vector layer (compiled per instruction set by cpu_foreach_isa.h;
// the ops and layouts: cpu_matmul.cpp).
//
// Batch invariance: a row of y is computed by the same operations in the same order whichever tile size
// (MT rows) and batch it comes in, and activation quantization is per row, so a row's result never
// depends on the other rows of x.

constexpr int kBlock = 64;
constexpr int kPrefetch = 8;   // groups of 32 ahead (256 bytes of int4 codes each, 320 of int5)
constexpr int kPrefetch8 = 4;  // int8 / IQ4 blocks of 64 ahead (1 KB / 512 bytes each)

// A weight's line, ahead of its use: non-temporally where the call reads each weight byte once (stream: few rows,
// one pass over a tile), so that streaming the weights does not flush the KV pool and the caller's working set
// from the outer caches; else as a line read again soon.
inline void prefetch_weight(const void* p, bool stream) { stream ? prefetch_once(p) : prefetch(p); }

// Weight lines ahead of use. A one-row tile (memory-bound) issues a 64-block's group by group: a block's at once
// stalled on the core's few outstanding misses (Zen 1). Tiles of more rows (arithmetic-bound) issue the block's at
// its top, which costs them less (bench_weight_forms.py --rows 1 4 8 measures both).
inline void prefetch_lines(const uint8_t* p, int64_t bytes, bool stream) {
  for (int64_t line = 0; line < bytes; line += 64) prefetch_weight(p + line, stream);
}

// x rows [r0, r1), 64-blocks [b0, b1) of each, quantized per group of 32 (a group's result depends on nothing
// else): q int8, a = max|x| / 127 per group, s = sum(q) per group, t = a * s per group (int4's minimum term), s16 =
// sum(q) per 16 (int6's offset term). Groups of 32, as llama.cpp's Q8_0 / Q8_1: one scale per 64 doubled the
// KL divergence from the float model (benchmarks/bench_fidelity.py).
template <typename T>
void quantize_rows(const T* x, int64_t r0, int64_t r1, int64_t b0, int64_t b1, const QuantizedX& out) {
  const int64_t k = out.k, nb = out.nb;
  for (int64_t i = r0; i < r1; ++i) {
    for (int64_t b = b0; b < b1; ++b) {
      const T* src = x + i * k + b * kBlock;
      int8_t* dst = out.q + i * k + b * kBlock;
      for (int h = 0; h < 2; ++h) {
        const F16 v0 = fload(src + 32 * h), v1 = fload(src + 32 * h + 16);
        const float mx = reduce_max(fmax(fabs(v0), fabs(v1)));
        const float a = mx / 127.f;
        const F16 inv = fset1(mx > 0.f ? 127.f / mx : 0.f);
        const I16 q0 = round_to_int(mul(v0, inv)), q1 = round_to_int(mul(v1, inv));
        store_int8(dst + 32 * h, q0);
        store_int8(dst + 32 * h + 16, q1);
        const int32_t s0 = isum(q0), s1 = isum(q1);
        out.s16[(i * nb + b) * 4 + 2 * h] = static_cast<int16_t>(s0);
        out.s16[(i * nb + b) * 4 + 2 * h + 1] = static_cast<int16_t>(s1);
        const int64_t g = (i * nb + b) * 2 + h;
        out.s[g] = s0 + s1;
        out.t[g] = a * static_cast<float>(s0 + s1);
        out.a[g] = a;
      }
    }
  }
}

// y[m0 : m0 + MT, 16 tile : 16 tile + 16] for int4 (Bits 4) or int5 (Bits 5) weights. Per group of 32 along K (one
// weight scale d_g, one activation scale a_g): the group's int32 dot product scaled as (ip d_g) a_g, plus the
// minimums' mn_g t_g. Without stored minimums (mn null: GGUF's Q4_0, w = d (q - 8)) mn_g is -8 d_g, exactly
// what a stored one would hold, so the result is the same bits either way (int5 always stores them).
// KForm (GGUF's Q4_K / Q5_K layout): each group's codes are followed by the tile's 16 6-bit scales sc_g and 16
// minimums m_g (bytes), and d, mn hold d and -dmin per 256, so d_g = d sc_g and mn_g = -dmin m_g (exact in
// float32) take the place of the float16 values a group has otherwise.
template <int MT, int Bits, bool KForm, typename T>
void nibble_tile(const uint8_t* codes, const at::Half* d, const at::Half* mn, int64_t n, int64_t tile,
                 const QuantizedX& xq, int64_t m0, T* y) {
  constexpr int64_t kQuad = Bits == 5 ? 40 : 32, kCodeBytes = 8 * kQuad;  // code bytes per k-quad, per group
  constexpr int64_t kGroupBytes = kCodeBytes + (KForm ? 32 : 0);
  const int64_t k = xq.k, nb = xq.nb, g_count = k / 32, s_count = KForm ? k / 256 : g_count;
  const uint8_t* wt = codes + tile * g_count * kGroupBytes;
  const at::Half* dt = d + tile * s_count * 16;
  const at::Half* mt = mn != nullptr ? mn + tile * s_count * 16 : nullptr;
  const int8_t* xs = xq.q + m0 * k;
  F16 acc[MT];
  for (int i = 0; i < MT; ++i) acc[i] = fzero();
  prefetch_weight(d + (tile + 1) * s_count * 16, xq.stream);  // the next tile's scales, read soon after this one
  if (mn != nullptr) prefetch_weight(mn + (tile + 1) * s_count * 16, xq.stream);
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* ahead = wt + (2 * b + kPrefetch) * kGroupBytes;  // the block kPrefetch groups on
    if constexpr (MT > 1) prefetch_lines(ahead, 2 * kGroupBytes, xq.stream);
    // group g's scale and minimum, each loaded where it is used (fewer live registers at 8 rows)
    auto sub = [&](int64_t g) { return reinterpret_cast<const int8_t*>(wt + g * kGroupBytes + kCodeBytes); };
    auto scale = [&](int64_t g) {
      if constexpr (KForm) return mul(to_float(widen_int8(sub(g))), fload(dt + b / 4 * 16));  // sc_g [16]
      return fload(dt + g * 16);
    };
    auto minimum = [&](int64_t g) {
      if constexpr (KForm) return mul(to_float(widen_int8(sub(g) + 16)), fload(mt + b / 4 * 16));  // m_g [16]
      return mt != nullptr ? fload(mt + g * 16) : mul(fload(dt + g * 16), fset1(-8.f));
    };
    for (int h = 0; h < 2; ++h) {
      if constexpr (MT == 1) prefetch_lines(ahead + h * kGroupBytes, kGroupBytes, xq.stream);
      I16 ip[MT];
      if constexpr (Bits == 5) {
        dot_int5_group<MT>(wt + (2 * b + h) * kGroupBytes, xs + b * kBlock + 32 * h, k, ip);
      } else {
        dot_int4_group<MT>(wt + (2 * b + h) * kGroupBytes, xs + b * kBlock + 32 * h, k, ip);
      }
      const F16 dh = scale(2 * b + h);
      for (int i = 0; i < MT; ++i) {
        acc[i] = fmadd(mul(to_float(ip[i]), dh), fset1(xq.a[((m0 + i) * nb + b) * 2 + h]), acc[i]);
      }
    }
    const F16 n0 = minimum(2 * b), n1 = minimum(2 * b + 1);
    for (int i = 0; i < MT; ++i) {
      const float* t = xq.t + ((m0 + i) * nb + b) * 2;
      acc[i] = fmadd(n0, fset1(t[0]), acc[i]);
      acc[i] = fmadd(n1, fset1(t[1]), acc[i]);
    }
  }
  for (int i = 0; i < MT; ++i) fstore(y + (m0 + i) * n + tile * 16, acc[i]);
}

// y[m0 : m0 + MT, 16 tile : 16 tile + 16] for int8 weights, w = d q per group of 32 along K (GGUF's Q8_0), or
// (Iq4) int4 codes indexing 16 int8 values kv (IQ4_NL's for GGUF's IQ4_NL and IQ4_XS), w = d kv[q] (Xs: each group's
// codes followed by the tile's 16 int8 scales sc, d per 256, so d_g = d sc exactly in float32): per group of 32
// along K (one weight scale, one activation scale) the exact int32 dot product (less the bias times sum(x) where
// the path biases w to unsigned bytes) scaled as (ip d) a, the same order of operations as int4's.
// Small: the values lie in [-64, 63] and come plus 64 (kUnsignedTables).
template <int MT, bool Iq4, bool Xs, typename T, bool Small = false>
void byte_value_tile(const uint8_t* codes, const at::Half* d, const Iq4Table& values, int64_t n, int64_t tile,
                     const QuantizedX& xq, int64_t m0, T* y) {
  constexpr int64_t kGroupBytes = Iq4 ? (Xs ? 272 : 256) : 512;  // a group of 32 k x 16 rows: nibbles (+ sc) or int8
  constexpr int32_t kBias = Small ? sub_offset(4) : Iq4 ? kIq4Bias : kInt8Bias;
  const int64_t k = xq.k, nb = xq.nb, g_count = k / 32, s_count = Xs ? k / 256 : g_count;
  const uint8_t* wt = codes + tile * g_count * kGroupBytes;
  const at::Half* dt = d + tile * s_count * 16;
  const int8_t* xs = xq.q + m0 * k;
  F16 acc[MT];
  for (int i = 0; i < MT; ++i) acc[i] = fzero();
  prefetch_weight(d + (tile + 1) * s_count * 16, xq.stream);  // the next tile's scales, read soon after this one
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* ahead = wt + 2 * (b + kPrefetch8) * kGroupBytes;  // the block kPrefetch8 blocks on
    if constexpr (MT > 1) prefetch_lines(ahead, 2 * kGroupBytes, xq.stream);
    for (int h = 0; h < 2; ++h) {
      if constexpr (MT == 1) prefetch_lines(ahead + h * kGroupBytes, kGroupBytes, xq.stream);
      I16 ip[MT];
      if constexpr (Small) {
        dot_table<MT, 8>(wt + (2 * b + h) * kGroupBytes, xs + b * kBlock + 32 * h, k, values, ip);
      } else if constexpr (Iq4) {
        dot_iq4_group<MT>(wt + (2 * b + h) * kGroupBytes, xs + b * kBlock + 32 * h, k, values, ip);
      } else {
        dot_int8_group<MT>(reinterpret_cast<const int8_t*>(wt) + (2 * b + h) * kGroupBytes, xs + b * kBlock + 32 * h, k,
                           ip);
      }
      F16 dh;
      if constexpr (Xs) {
        const int8_t* sc = reinterpret_cast<const int8_t*>(wt + (2 * b + h) * kGroupBytes + 256);
        dh = mul(to_float(widen_int8(sc)), fload(dt + b / 4 * 16));
      } else {
        dh = fload(dt + (2 * b + h) * 16);
      }
      for (int i = 0; i < MT; ++i) {
        if (kBias != 0) ip[i] = isub_scalar(ip[i], kBias * xq.s[((m0 + i) * nb + b) * 2 + h]);
        acc[i] = fmadd(mul(to_float(ip[i]), dh), fset1(xq.a[((m0 + i) * nb + b) * 2 + h]), acc[i]);
      }
    }
  }
  for (int i = 0; i < MT; ++i) fstore(y + (m0 + i) * n + tile * 16, acc[i]);
}

// Adds the offsets' -off sc_j s16_j (int6: off 32, int3: 4) to sum, or the minimums' m_j s16_j (int2) to mins, for
// sub-blocks (2 p, 2 p + 1) of a 64-block (sub: its first), its group of 32 p, as int16 pairs (|off sc_j| <= 4,096, |s16| <= 2,032)
// against row i's pair of s16 (two int16 read as one int32): the same integers as the tile's per sub-block form
template <int MT, int Bits>
inline void add_offset_pairs(const uint8_t* sub, const QuantizedX& xq, int64_t m0, int64_t b, int p, I16* sum,
                             F16* mins) {
  constexpr int64_t kSub = sub_block_bytes(Bits), kCoefAt = 4 * sub_quad_bytes(Bits) + (Bits == 2 ? 16 : 0);
  constexpr int16_t kCoef = Bits == 2 ? 1 : -sub_offset(Bits);
  I16 msum[MT];
  for (int i = 0; i < MT; ++i) msum[i] = izero();
  const int8_t* c0 = reinterpret_cast<const int8_t*>(sub + 2 * p * kSub + kCoefAt);
  const I16 pairs = widen_pairs(c0, c0 + kSub, kCoef);
  for (int i = 0; i < MT; ++i) {
    int32_t s_pair;
    std::memcpy(&s_pair, xq.s16 + ((m0 + i) * xq.nb + b) * 4 + 2 * p, 4);
    if constexpr (Bits == 2) {
      msum[i] = idot_pairs(pairs, s_pair, msum[i]);
    } else {
      sum[i] = idot_pairs(pairs, s_pair, sum[i]);
    }
  }
  if constexpr (Bits == 2) {
    for (int i = 0; i < MT; ++i) mins[i] = add(mins[i], to_float(msum[i]));
  }
}

// y[m0 : m0 + MT, 16 tile : 16 tile + 16] for int6 weights (Bits 6, GGUF's Q6_K: w = d sc_j (q - 32), q in [0, 63])
// or int3 (Bits 3, Q3_K: w = d sc_j (q - 4), q in [0, 7]): sc_j int8 per sub-block of 16 along K, d float16 per 256.
// Per group of 32 along K (one activation scale a) its two sub-blocks' exact int32 sum of sc_j (ip_j - off s16_j),
// then times d a: the file's own arithmetic, no rounding of d sc_j. codes [N / 16, K / 16, SubBytes]: per sub-block 4
// k-quads (int6: 48 bytes, int4's 32 bytes of nibbles then 16 of high bits, lane l's two at bits 2 (l / 16) of byte
// l % 16; int3: 24 bytes, the low two bits so, then 8 of third bits, bit l for lane l), then the 16 rows' sc_j.
// int2 (Bits 2, Q2_K): w = d sc_j q - dmin m_j, q in [0, 3], sc_j and m_j 4-bit: the int32 sums of sc_j ip_j and of
// m_j s16_j, then (d sum + (-dmin) mins) a; per sub-block 4 k-quads of 16 bytes (int3's low bit pairs), then the 16
// rows' sc_j, then their m_j; mn holds -dmin per 256. The table form (Bits 4, GGUF's IQ2_XS / IQ2_S): w = d sc_j kv[q],
// int4 codes q into 16 values kv in [-64, 63] (table: kv + 64), per sub-block int4's 4 k-quads of 32 bytes, then the
// 16 rows' sc_j; int6's arithmetic with off 64. The offsets (minimums) go in pairs (add_offset_pairs) from 4
// rows where the vector layer dots int16 pairs in one instruction (kPairDot), else per sub-block (the pairs' widening
// costs more than it saves): the same integers either way.
template <int MT, int Bits, typename T>
void subblock_tile(const uint8_t* codes, const at::Half* d, const at::Half* mn, const Iq4Table* table, int64_t n,
                   int64_t tile, const QuantizedX& xq, int64_t m0, T* y) {
  constexpr int64_t kSub = sub_block_bytes(Bits), kScalesAt = 4 * sub_quad_bytes(Bits);
  constexpr bool kPairs = kPairDot && MT >= 4;
  const int64_t k = xq.k, nb = xq.nb;
  const uint8_t* wt = codes + tile * (k / 16) * kSub;
  const at::Half* dt = d + tile * (k / 256) * 16;
  const int8_t* xs = xq.q + m0 * k;
  F16 acc[MT];
  for (int i = 0; i < MT; ++i) acc[i] = fzero();
  prefetch_weight(d + (tile + 1) * (k / 256) * 16, xq.stream);  // the next tile's scales, read soon after this one
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* ahead = wt + (4 * b + 8) * kSub;  // the block two on
    if constexpr (MT > 1) prefetch_lines(ahead, 4 * kSub, xq.stream);
    const F16 db = fload(dt + (b / 4) * 16);
    for (int p = 0; p < 2; ++p) {  // the block's groups of 32, each with its activation scale
      I16 sum[MT];
      F16 mins[MT];  // int2's sum of m_j s16_j (exact in float32: below 2^24)
      for (int i = 0; i < MT; ++i) sum[i] = izero();
      for (int i = 0; i < MT; ++i) mins[i] = fzero();
      if constexpr (kPairs) add_offset_pairs<MT, Bits>(wt + 4 * b * kSub, xq, m0, b, p, sum, mins);
      for (int j = 2 * p; j < 2 * p + 2; ++j) {
        const uint8_t* sub = wt + (4 * b + j) * kSub;
        if constexpr (MT == 1) prefetch_lines(ahead + j * kSub, kSub, xq.stream);
        const int16_t* s16 = xq.s16 + (m0 * nb + b) * 4 + j;  // row i's at s16[i nb 4]
        I16 ip[MT];
        if constexpr (Bits == 6) dot_int6_sub<MT>(sub, xs + b * kBlock + 16 * j, k, ip);
        if constexpr (Bits == 3) dot_int3_sub<MT>(sub, xs + b * kBlock + 16 * j, k, ip);
        if constexpr (Bits == 2) dot_int2_sub<MT>(sub, xs + b * kBlock + 16 * j, k, ip);
        if constexpr (Bits == 4) dot_table<MT, 4>(sub, xs + b * kBlock + 16 * j, k, *table, ip);
        const I16 sc = widen_int8(reinterpret_cast<const int8_t*>(sub + kScalesAt));
        for (int i = 0; i < MT; ++i) {
          const I16 off = kPairs || Bits == 2 ? ip[i] : isub_scalar(ip[i], sub_offset(Bits) * s16[i * nb * 4]);
          sum[i] = imadd(off, sc, sum[i]);
        }
        if constexpr (!kPairs && Bits == 2) {
          const F16 mj = to_float(widen_int8(reinterpret_cast<const int8_t*>(sub + kScalesAt + 16)));
          for (int i = 0; i < MT; ++i) mins[i] = fmadd(mj, fset1(static_cast<float>(s16[i * nb * 4])), mins[i]);
        }
      }
      for (int i = 0; i < MT; ++i) {
        F16 v = mul(to_float(sum[i]), db);
        if constexpr (Bits == 2) v = fmadd(mins[i], fload(mn + tile * (k / 256) * 16 + (b / 4) * 16), v);
        acc[i] = fmadd(v, fset1(xq.a[((m0 + i) * nb + b) * 2 + p]), acc[i]);
      }
    }
  }
  for (int i = 0; i < MT; ++i) fstore(y + (m0 + i) * n + tile * 16, acc[i]);
}

// tile_fn(MT, tile, m0) over tiles [t0, t1) and x's rows in runs of kMaxRows, then halving.
template <typename TileFn>
void for_row_runs(int64_t m, int64_t t0, int64_t t1, const TileFn& tile_fn) {
  for (int64_t t = t0; t < t1; ++t) {
    int64_t m0 = 0;
    if constexpr (kMaxRows >= 8) {
      for (; m0 + 8 <= m; m0 += 8) tile_fn(std::integral_constant<int, 8>{}, t, m0);
    }
    for (; m0 + 4 <= m; m0 += 4) tile_fn(std::integral_constant<int, 4>{}, t, m0);
    if (m - m0 >= 2) { tile_fn(std::integral_constant<int, 2>{}, t, m0); m0 += 2; }
    if (m - m0 >= 1) tile_fn(std::integral_constant<int, 1>{}, t, m0);
  }
}

// int4 (Bits 4) or int5 (Bits 5) tiles; kform: the K-quant layout (see nibble_tile)
template <int Bits, typename T>
void nibble_tiles(const uint8_t* codes, const at::Half* d, const at::Half* mn, bool kform, int64_t n, int64_t t0,
                  int64_t t1, const QuantizedX& xq, int64_t m, T* y) {
  for_row_runs(m, t0, t1, [&](auto mt, int64_t t, int64_t m0) {
    if (kform) {
      nibble_tile<decltype(mt)::value, Bits, true>(codes, d, mn, n, t, xq, m0, y);
    } else {
      nibble_tile<decltype(mt)::value, Bits, false>(codes, d, mn, n, t, xq, m0, y);
    }
  });
}

template <typename T>
void int4_tiles(const uint8_t* codes, const at::Half* d, const at::Half* mn, bool kform, int64_t n, int64_t t0,
                int64_t t1, const QuantizedX& xq, int64_t m, T* y) {
  nibble_tiles<4>(codes, d, mn, kform, n, t0, t1, xq, m, y);
}

// int5: the int4 layout's nibbles (32 bytes a k-quad) then the fifth bits (8 bytes: bit l of lane l, lanes in
// int4_quad's order), w = d q + mn with q in [0, 31] (GGUF's Q5_0, Q5_1, Q5_K); mn is always stored
template <typename T>
void int5_tiles(const uint8_t* codes, const at::Half* d, const at::Half* mn, bool kform, int64_t n, int64_t t0,
                int64_t t1, const QuantizedX& xq, int64_t m, T* y) {
  nibble_tiles<5>(codes, d, mn, kform, n, t0, t1, xq, m, y);
}

template <typename T>
void int6_tiles(const uint8_t* codes, const at::Half* d, int64_t n, int64_t t0, int64_t t1, const QuantizedX& xq,
                int64_t m, T* y) {
  for_row_runs(m, t0, t1, [&](auto mt, int64_t t, int64_t m0) {
    subblock_tile<decltype(mt)::value, 6>(codes, d, nullptr, nullptr, n, t, xq, m0, y);
  });
}

template <typename T>
void int3_tiles(const uint8_t* codes, const at::Half* d, int64_t n, int64_t t0, int64_t t1, const QuantizedX& xq,
                int64_t m, T* y) {
  for_row_runs(m, t0, t1, [&](auto mt, int64_t t, int64_t m0) {
    subblock_tile<decltype(mt)::value, 3>(codes, d, nullptr, nullptr, n, t, xq, m0, y);
  });
}

// int2 (Q2_K): codes [N/16, K/16, 96], d and mn (-dmin) [N/16, K/256, 16]
template <typename T>
void int2_tiles(const uint8_t* codes, const at::Half* d, const at::Half* mn, int64_t n, int64_t t0, int64_t t1,
                const QuantizedX& xq, int64_t m, T* y) {
  for_row_runs(m, t0, t1, [&](auto mt, int64_t t, int64_t m0) {
    subblock_tile<decltype(mt)::value, 2>(codes, d, mn, nullptr, n, t, xq, m0, y);
  });
}

// the table form (IQ2_XS / IQ2_S): codes [N/16, K/16, 144], d [N/16, K/256, 16], values int8 [16] in [-64, 63]
template <typename T>
void table_tiles(const uint8_t* codes, const at::Half* d, const int8_t* values, int64_t n, int64_t t0, int64_t t1,
                 const QuantizedX& xq, int64_t m, T* y) {
  const Iq4Table table = biased_values(values, sub_offset(4));
  for_row_runs(m, t0, t1, [&](auto mt, int64_t t, int64_t m0) {
    subblock_tile<decltype(mt)::value, 4>(codes, d, nullptr, &table, n, t, xq, m0, y);
  });
}

template <typename T>
void int8_tiles(const int8_t* q, const at::Half* d, int64_t n, int64_t t0, int64_t t1, const QuantizedX& xq, int64_t m,
                T* y) {
  const uint8_t* codes = reinterpret_cast<const uint8_t*>(q);
  for_row_runs(m, t0, t1, [&](auto mt, int64_t t, int64_t m0) {
    byte_value_tile<decltype(mt)::value, false, false>(codes, d, kIq4Values, n, t, xq, m0, y);
  });
}

// int4 codes into 16 int8 values: codes [N/16, K/32, 256] (int4's nibbles, a group's 8 k-quads in a row), d per
// 32; xs: [N/16, K/32, 272], each group's codes then the tile's 16 int8 scales, d per 256
template <typename T>
void iq4_tiles(const uint8_t* codes, const at::Half* d, const int8_t* values, bool xs, int64_t n, int64_t t0,
               int64_t t1, const QuantizedX& xq, int64_t m, T* y) {
  const bool small = kUnsignedTables && small_values(values);
  const Iq4Table table = biased_values(values, small ? sub_offset(4) : kIq4Bias);  // as the dot product takes them
  for_row_runs(m, t0, t1, [&](auto mt, int64_t t, int64_t m0) {
    constexpr int kMT = decltype(mt)::value;
    if constexpr (kUnsignedTables) {
      if (small && xs) return byte_value_tile<kMT, true, true, T, true>(codes, d, table, n, t, xq, m0, y);
      if (small) return byte_value_tile<kMT, true, false, T, true>(codes, d, table, n, t, xq, m0, y);
    }
    if (xs) {
      byte_value_tile<kMT, true, true>(codes, d, table, n, t, xq, m0, y);
    } else {
      byte_value_tile<kMT, true, false>(codes, d, table, n, t, xq, m0, y);
    }
  });
}

// rows [r0, r1), columns [j0, j1) (multiples of 16) of x [M, K] (T) -> float32 xf [M, K]
template <typename T>
void widen_rows(const T* x, int64_t r0, int64_t r1, int64_t j0, int64_t j1, int64_t k, float* xf) {
  for (int64_t i = r0; i < r1; ++i) {
    for (int64_t j = j0; j < j1; j += 16) fstore(xf + i * k + j, fload(x + i * k + j));
  }
}

template <int MT, typename T, typename W>
void dense_tile(const W* w, int64_t n, int64_t k, int64_t tile, const float* xf, int64_t m0, bool stream, T* y) {
  const W* wt = w + tile * k * 16;
  const float* xs = xf + m0 * k;
  F16 acc[MT];
  for (int i = 0; i < MT; ++i) acc[i] = fzero();
  for (int64_t kk = 0; kk < k; ++kk) {
    if ((kk & 7) == 0) prefetch_weight(wt + (kk + 32) * 16, stream);
    const F16 wv = fload(wt + kk * 16);
    for (int i = 0; i < MT; ++i) acc[i] = fmadd(wv, fset1(xs[i * k + kk]), acc[i]);
  }
  for (int i = 0; i < MT; ++i) fstore(y + (m0 + i) * n + tile * 16, acc[i]);
}

template <typename T, typename W>
void dense_tiles(const W* w, int64_t n, int64_t k, int64_t t0, int64_t t1, const float* xf, int64_t m, T* y) {
  const bool stream = m <= kStreamRows;
  for (int64_t t = t0; t < t1; ++t) {
    int64_t m0 = 0;
    for (; m0 + kMaxRows <= m; m0 += kMaxRows) dense_tile<kMaxRows>(w, n, k, t, xf, m0, stream, y);
    if (kMaxRows > 4 && m - m0 >= 4) { dense_tile<4>(w, n, k, t, xf, m0, stream, y); m0 += 4; }
    if (m - m0 >= 2) { dense_tile<2>(w, n, k, t, xf, m0, stream, y); m0 += 2; }
    if (m - m0 >= 1) dense_tile<1>(w, n, k, t, xf, m0, stream, y);
  }
}
