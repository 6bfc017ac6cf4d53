// Attention straight from the paged KV pool, written once against the vector layer (compiled per
// instruction set by cpu_foreach_isa.h; the ops are in cpu_decode_attention.cpp). One task is n query
// tokens x the G query heads of one KV head, R = n G rows; row r = (token r / G, head r % G) sees keys
// [0, len - n + r / G] of its slot list (causal; decode: n = 1, every key).
//
// Cache invariance: a row's result depends only on its query and its keys, never on how many tokens the
// task holds, where the keys came from, or whether it is a decode or an extend step. Each key's score is
// the same dot-product tree (chunk by chunk, then reduce4's tree for that one accumulator) whichever form
// computes it (keys in registers for few rows, a buffer of 4 widened keys for many); the softmax sums 16-key
// vectors aligned to position 0 (keys past the row's last are exact zeros) and reduces them by one tree;
// values accumulate key by key in position order.

// Slots are scattered through the pool, and after a step's weights have streamed they are in no cache: fetch
// the row kAhead tokens on while this one is computed.
constexpr int64_t kAhead = 48;

template <typename T>
inline void prefetch_row(const T* base, const Rows& rows, int64_t t, int64_t len, int64_t bytes) {
  if (t >= len) return;
  const char* p = reinterpret_cast<const char*>(base + rows.slot(t) * (bytes / static_cast<int64_t>(sizeof(T))));
  for (int64_t off = 0; off < bytes; off += 64) prefetch(p + off);
}

inline uint32_t lanes_from(int64_t n) {  // the bits of lanes n .. 15
  return n >= 16 ? 0u : n <= 0 ? 0xFFFFu : (0xFFFFu << n) & 0xFFFFu;
}

// The query rows a task holds in registers while its keys stream (reduce4 sums four accumulators at once).
constexpr int kScoreRows = 4;
static_assert(kScoreRows == 4, "scores_in_registers hands reduce4 exactly four accumulators");

// Few rows (decode: the G heads of one KV head): each key is widened in registers and met by every row at
// once; the q rows, already float32 in qf, are read from L1. reduce4 sums each accumulator by its own tree,
// so a row's score is the same as scores_buffered gives it.
template <int DC, int RB, typename T>
void scores_in_registers(const float* qf, int64_t r_count, const T* kh, const Rows& rows, float scale,
                         int64_t stride, float* out, int64_t k0, int64_t len) {
  if constexpr (RB > 1) {
    if (r_count < RB) return scores_in_registers<DC, RB - 1>(qf, r_count, kh, rows, scale, stride, out, k0, len);
  }
  constexpr int D = DC * 16;
  for (int64_t t = k0; t < len; ++t) {
    prefetch_row(kh, rows, t + kAhead, len, D * static_cast<int64_t>(sizeof(T)));
    const T* kp = kh + rows.slot(t) * D;
    F16 acc[kScoreRows] = {fzero(), fzero(), fzero(), fzero()};
    for (int c = 0; c < DC; ++c) {
      const F16 kc = fload(kp + 16 * c);
      for (int r = 0; r < RB; ++r) acc[r] = fmadd(fload(qf + r * D + 16 * c), kc, acc[r]);
    }
    float s[4];
    reduce4(acc[0], acc[1], acc[2], acc[3], s);
    for (int r = 0; r < RB; ++r) out[r * stride + t] = s[r] * scale;
  }
}

// Many rows (extend): keys widened once per group of 4 into a buffer that every row reads back.
template <int DC, typename T>
void scores_buffered(const float* qf, int64_t r_count, const T* kh, const Rows& rows, float scale,
                     int64_t stride, float* out, int64_t k0, int64_t len) {
  constexpr int D = DC * 16;
  alignas(64) float kbuf[4][D];  // four keys, widened once for every row
  for (int64_t t = k0; t < len; t += 4) {
    for (int j = 0; j < 4; ++j) {
      prefetch_row(kh, rows, t + j + kAhead, len, D * static_cast<int64_t>(sizeof(T)));
      const T* kp = kh + rows.slot(std::min(t + j, len - 1)) * D;  // past the end: a repeat, never used
      for (int c = 0; c < DC; ++c) fstore(kbuf[j] + 16 * c, fload(kp + 16 * c));
    }
    for (int64_t r = 0; r < r_count; ++r) {
      const float* qp = qf + r * D;
      F16 acc[4] = {fzero(), fzero(), fzero(), fzero()};
      for (int c = 0; c < DC; ++c) {
        const F16 qc = fload(qp + 16 * c);
        for (int j = 0; j < 4; ++j) acc[j] = fmadd(qc, fload(kbuf[j] + 16 * c), acc[j]);
      }
      float s[4];
      reduce4(acc[0], acc[1], acc[2], acc[3], s);
      for (int j = 0; j < 4 && t + j < len; ++j) out[r * stride + t + j] = s[j] * scale;
    }
  }
}

// scores[r * stride + t] = scale * q_r . k_t for every row and keys [k0, min(k1, len)) (k0 a multiple of 4;
// masking is the softmax's job). q rows are widened to float32 once (qf: r_count x D). A key's score is
// q_r . k_t summed chunk by chunk in order, then across lanes by reduce4's tree: it does not depend on the
// range it is computed in, nor on which of the two forms computes it.
template <int DC, typename T>
void scores(const T* q, const QueryRows& qr, const T* kh, const Rows& rows, float scale, int64_t stride,
            std::vector<float>& qf, float* out, int64_t k0, int64_t k1) {
  constexpr int D = DC * 16;
  const int64_t len = std::min(rows.len, k1), r_count = qr.n * qr.g;
  qf.resize(r_count * D);
  for (int64_t r = 0; r < r_count; ++r) {
    for (int c = 0; c < DC; ++c) fstore(qf.data() + r * D + 16 * c, fload(q + qr.offset(r, D) + 16 * c));
  }
  if (r_count <= kScoreRows) {
    scores_in_registers<DC, kScoreRows>(qf.data(), r_count, kh, rows, scale, stride, out, k0, len);
  } else {
    scores_buffered<DC>(qf.data(), r_count, kh, rows, scale, stride, out, k0, len);
  }
}

// A row's softmax numerators over its first live_len keys, in place (0 beyond them) -> 1 / their sum.
inline float softmax_row(float* s, int64_t live_len, int64_t stride) {
  F16 mx = fset1(-INFINITY);
  for (int64_t t = 0; t < live_len; t += 16) {
    mx = fmax(mx, select_bits(fload(s + t), lanes_from(live_len - t), -INFINITY));
  }
  const F16 m = fset1(reduce_max(mx));
  F16 sum = fzero();
  for (int64_t t = 0; t < stride; t += 16) {
    const F16 e = keep_first(fexp(sub(fload(s + t), m)), live_len - t);
    fstore(s + t, e);
    sum = add(sum, e);
  }
  return 1.f / reduce_add(sum);
}

// out rows [r0, r0 + RB), dims [16 c0, 16 (c0 + CB)): sum_t p[r, t] v_t / sum over keys [0, keys), key by key.
template <int DC, int RB, int CB, typename T>
void values(const float* probs, int64_t stride, int64_t r0, int64_t c0, int64_t keys, const T* vh, const Rows& rows,
            const float* inv_sum, T* out, const QueryRows& orow) {
  constexpr int D = DC * 16;
  F16 acc[RB][CB];
  for (int i = 0; i < RB; ++i)
    for (int c = 0; c < CB; ++c) acc[i][c] = fzero();
  for (int64_t t = 0; t < keys; ++t) {
    prefetch_row(vh, rows, t + kAhead, keys, D * static_cast<int64_t>(sizeof(T)));
    const T* vp = vh + rows.slot(t) * D + 16 * c0;
    for (int c = 0; c < CB; ++c) {
      const F16 vv = fload_unordered(vp + 16 * c);
      for (int i = 0; i < RB; ++i) acc[i][c] = fmadd(fset1(probs[(r0 + i) * stride + t]), vv, acc[i][c]);
    }
  }
  for (int i = 0; i < RB; ++i) {
    T* o = out + orow.offset(r0 + i, D) + 16 * c0;
    for (int c = 0; c < CB; ++c) fstore_unordered(o + 16 * c, mul(acc[i][c], fset1(inv_sum[r0 + i])));
  }
}

// Rows [r0, r1) as one block of RB = r1 - r0 (1 to kValueRows) rows, each over keys [0, keys).
template <int DC, int CB, int RB, typename T>
void values_block(const float* probs, int64_t stride, int64_t r0, int64_t r1, int64_t c0, int64_t keys,
                  const T* vh, const Rows& rows, const float* inv_sum, T* out, const QueryRows& orow) {
  if constexpr (RB > 1) {
    if (r1 - r0 < RB) return values_block<DC, CB, RB - 1>(probs, stride, r0, r1, c0, keys, vh, rows, inv_sum, out, orow);
  }
  values<DC, RB, CB>(probs, stride, r0, c0, keys, vh, rows, inv_sum, out, orow);
}

// The three stages of one task, each over a range of its work, so that the threads of a parallel region can
// share a task (stage by stage, with a barrier between stages) and get the bits of one thread doing all of it:
// scores over keys, the softmax over rows, the values over 16-dim chunks. s [r_count, stride] (stride = len
// rounded up to 16) and inv [r_count] are the task's, shared by the threads. DC = D / 16.
inline int64_t score_stride(const Rows& rows) { return (rows.len + 15) / 16 * 16; }
inline int64_t live_len(const Rows& rows, const QueryRows& qr, int64_t r) { return rows.len - qr.n + r / qr.g + 1; }

template <int DC, typename T>
void attend_scores(const T* q, const QueryRows& qr, const T* kh, const Rows& rows, float scale, float* s,
                   std::vector<float>& qf, int64_t k0, int64_t k1) {
  scores<DC>(q, qr, kh, rows, scale, score_stride(rows), qf, s, k0, k1);
}

// rows [r0, r1): their softmax numerators in place, 1 / their sums in inv
inline void attend_softmax(const QueryRows& qr, const Rows& rows, float* s, float* inv, int64_t r0, int64_t r1) {
  const int64_t stride = score_stride(rows);
  for (int64_t r = r0; r < r1; ++r) inv[r] = softmax_row(s + r * stride, live_len(rows, qr, r), stride);
}

// The chunks one block of values covers (attend_values' c ranges split at multiples of it).
template <int DC>
constexpr int value_chunks() { return DC < kValueChunks ? DC : kValueChunks; }

// 16-dim chunks [c_begin, c_end) of every row (c_begin a multiple of the block's CB chunks). Values go in
// blocks of kValueRows rows x CB chunks, each block one pass over its keys; a row's accumulation order is the
// same in any block.
template <int DC, typename T>
void attend_values(const QueryRows& qr, const T* vh, const Rows& rows, const float* s, const float* inv, T* out,
                   const QueryRows& orow, int64_t c_begin, int64_t c_end) {
  constexpr int CB = value_chunks<DC>();
  const int64_t stride = score_stride(rows), r_count = qr.n * qr.g;
  for (int64_t c0 = c_begin; c0 < std::min<int64_t>(c_end, DC); c0 += CB) {
    for (int64_t r0 = 0; r0 < r_count; r0 += kValueRows) {  // the keys of a block: those its last row sees
      const int64_t r1 = std::min(r_count, r0 + kValueRows);
      values_block<DC, CB, kValueRows>(s, stride, r0, r1, c0, live_len(rows, qr, r1 - 1), vh, rows, inv, out, orow);
    }
  }
}

// One task: q rows (n tokens x G heads of one KV head) over rows' keys -> out rows, on one thread.
template <int DC, typename T>
void attend_rows(const T* q, const QueryRows& qr, const T* kh, const T* vh, const Rows& rows, float scale,
                 Scratch& scratch, T* out, const QueryRows& orow) {
  const int64_t r_count = qr.n * qr.g;
  scratch.scores.assign(r_count * score_stride(rows), 0.f);
  scratch.inv_sum.resize(r_count);
  float* s = scratch.scores.data();
  attend_scores<DC>(q, qr, kh, rows, scale, s, scratch.q, 0, rows.len);
  attend_softmax(qr, rows, s, scratch.inv_sum.data(), 0, r_count);
  attend_values<DC>(qr, vh, rows, s, scratch.inv_sum.data(), out, orow, 0, DC);
}
