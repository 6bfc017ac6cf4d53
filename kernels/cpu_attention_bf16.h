// bfloat16 pools on CPUs with AVX512-BF16: q . k and p . v as vdpbf16ps (pairs of bf16 products summed
// into float32 lanes), so K and V are never widened to float32, and q . k is summed across lanes 4 keys
// at a time. Included after cpu_vec_avx512.h and cpu_attention_body.h (its softmax) in the AVX512-BF16
// region of cpu_decode_attention.cpp. Keys go in fixed groups of 4 from position 0 (a short last group is
// padded with a repeat of its last key, whose score is dropped), so a key's score never depends on the
// task's length: the same cache invariance as the body's, with bfloat16 products instead of float32 ones.

inline __m512bh as_bh(__m512i v) { return reinterpret_cast<__m512bh>(v); }
inline __m512i load_bf16x32(const at::BFloat16* p) { return _mm512_loadu_si512(p); }

// scores[r * stride + t] = scale * q_r . k_t for every row and key (masking is the softmax's job).
template <int KZ>
void scores_bf16(const at::BFloat16* q, const QueryRows& qr, const at::BFloat16* kh, const Rows& rows,
                 float scale, int64_t stride, float* scores) {
  constexpr int D = KZ * 32;
  const int64_t len = rows.len, r_count = qr.n * qr.g;
  for (int64_t t = 0; t < len; t += 4) {
    __m512i kv[4][KZ];
    for (int j = 0; j < 4; ++j) {
      prefetch_row(kh, rows, t + j + kAhead, len, D * 2);
      const at::BFloat16* kp = kh + rows.slot(std::min(t + j, len - 1)) * D;
      for (int c = 0; c < KZ; ++c) kv[j][c] = load_bf16x32(kp + 32 * c);
    }
    for (int64_t r = 0; r < r_count; ++r) {
      const at::BFloat16* qp = q + qr.offset(r, D);
      F16 acc[4] = {fzero(), fzero(), fzero(), fzero()};
      for (int c = 0; c < KZ; ++c) {
        const __m512bh qc = as_bh(load_bf16x32(qp + 32 * c));
        for (int j = 0; j < 4; ++j) acc[j].v = _mm512_dpbf16_ps(acc[j].v, qc, as_bh(kv[j][c]));
      }
      float s[4];
      reduce4(acc[0], acc[1], acc[2], acc[3], s);
      for (int j = 0; j < 4 && t + j < len; ++j) scores[r * stride + t + j] = s[j] * scale;
    }
  }
}

// out rows [r0, r0 + RB) = sum_t p[r, t] v_t / sum, with p as bf16 pairs (keys t, t + 1) against V rows
// interleaved pairwise. unpacklo/hi_epi16 interleave within 128-bit lanes: lo holds dims 8L..8L+3 of
// lane L, hi 8L+4..8L+7. The pairs run to the last key any of the RB rows sees.
template <int KZ, int RB>
void values_bf16(const uint16_t* probs, int64_t stride, int64_t r0, int64_t keys, const at::BFloat16* vh,
                 const Rows& rows, const float* inv_sum, at::BFloat16* out, const QueryRows& orow) {
  constexpr int D = KZ * 32;
  __m512 lo[RB][KZ], hi[RB][KZ];
  for (int i = 0; i < RB; ++i)
    for (int c = 0; c < KZ; ++c) lo[i][c] = hi[i][c] = _mm512_setzero_ps();
  for (int64_t t = 0; t < keys; t += 2) {
    prefetch_row(vh, rows, t + kAhead, keys, D * 2);
    prefetch_row(vh, rows, t + 1 + kAhead, keys, D * 2);
    const at::BFloat16* v0 = vh + rows.slot(t) * D;
    const at::BFloat16* v1 = t + 1 < keys ? vh + rows.slot(t + 1) * D : v0;  // its probability is 0
    __m512bh pp[RB];
    for (int i = 0; i < RB; ++i) {
      int32_t pair;
      std::memcpy(&pair, probs + (r0 + i) * stride + t, 4);
      pp[i] = as_bh(_mm512_set1_epi32(pair));
    }
    for (int c = 0; c < KZ; ++c) {
      const __m512i a = load_bf16x32(v0 + 32 * c), b = load_bf16x32(v1 + 32 * c);
      const __m512bh pl = as_bh(_mm512_unpacklo_epi16(a, b)), ph = as_bh(_mm512_unpackhi_epi16(a, b));
      for (int i = 0; i < RB; ++i) {
        lo[i][c] = _mm512_dpbf16_ps(lo[i][c], pl, pp[i]);
        hi[i][c] = _mm512_dpbf16_ps(hi[i][c], ph, pp[i]);
      }
    }
  }
  // back to dim order: lo lanes 4L..4L+3 are dims 8L..8L+3, hi's are 8L+4..8L+7
  const __m512i first = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
  const __m512i second = _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
  for (int i = 0; i < RB; ++i) {
    const __m512 inv = _mm512_set1_ps(inv_sum[r0 + i]);
    at::BFloat16* o = out + orow.offset(r0 + i, D);
    for (int c = 0; c < KZ; ++c) {
      fstore(o + 32 * c, F16{_mm512_mul_ps(_mm512_permutex2var_ps(lo[i][c], first, hi[i][c]), inv)});
      fstore(o + 32 * c + 16, F16{_mm512_mul_ps(_mm512_permutex2var_ps(lo[i][c], second, hi[i][c]), inv)});
    }
  }
}

// One task as attend_rows, on bfloat16 pools. KZ = D / 32.
template <int KZ>
void attend_rows_bf16(const at::BFloat16* q, const QueryRows& qr, const at::BFloat16* kh, const at::BFloat16* vh,
                      const Rows& rows, float scale, Scratch& scratch, at::BFloat16* out, const QueryRows& orow) {
  const int64_t stride = score_stride(rows), r_count = qr.n * qr.g;
  scratch.scores.assign(r_count * stride, 0.f);
  scratch.probs.resize(r_count * stride);
  scratch.inv_sum.resize(r_count);
  float* s = scratch.scores.data();
  scores_bf16<KZ>(q, qr, kh, rows, scale, stride, s);
  for (int64_t r = 0; r < r_count; ++r) {
    scratch.inv_sum[r] = softmax_row(s + r * stride, live_len(rows, qr, r), stride);
    for (int64_t t = 0; t < stride; t += 16) {  // the numerators as bfloat16, for vdpbf16ps
      const __m256bh b = _mm512_cvtneps_pbh(_mm512_loadu_ps(s + r * stride + t));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(scratch.probs.data() + r * stride + t), reinterpret_cast<__m256i>(b));
    }
  }
  int64_t r0 = 0;
  for (; r0 + 4 <= r_count; r0 += 4) {
    values_bf16<KZ, 4>(scratch.probs.data(), stride, r0, live_len(rows, qr, r0 + 3), vh, rows, scratch.inv_sum.data(), out, orow);
  }
  for (; r0 < r_count; ++r0) {
    values_bf16<KZ, 1>(scratch.probs.data(), stride, r0, live_len(rows, qr, r0), vh, rows, scratch.inv_sum.data(), out, orow);
  }
}
