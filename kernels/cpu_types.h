// Types the kernel bodies and the ops of several files share: quantized activations, and where an attention
// task's keys and query rows are. Included by cpu_isa.h.
#pragma once

#include <cstdint>
#include <vector>

namespace radixlm_cpu {

// The layouts the matmul bodies share with the ops' checks. The sub-block forms (int2, int3, int6: scales per 16
// along K; and 4: int4 codes into a table of 16 values, as GGUF's IQ2_XS / IQ2_S) hold a sub-block of a 16-row tile
// as 4 k-quads of codes, then the rows' int8 scales (int2: then its minimums): bytes a k-quad, bytes a sub-block.
constexpr int64_t sub_quad_bytes(int64_t bits) { return bits == 6 ? 48 : bits == 3 ? 24 : bits == 4 ? 32 : 16; }
constexpr int64_t sub_block_bytes(int64_t bits) { return 4 * sub_quad_bytes(bits) + (bits == 2 ? 32 : 16); }
// the codes' offset: w = d sc (q - offset) (int2: d sc q less its minimum, no offset; 4: q the table's value, stored
// plus 64, so the values lie in [-64, 63])
constexpr int32_t sub_offset(int64_t bits) { return bits == 6 ? 32 : bits == 3 ? 4 : bits == 4 ? 64 : 0; }
// The IQ4 layout's codes index a table of 16 int8 values: IQ4_NL's (the codes of GGUF's IQ4_NL and IQ4_XS;
// cpu_matmul.py's IQ4_VALUES) unless the weight brings its own (cpu_matmul.py's GRID_VALUES)
struct Iq4Table {
  alignas(16) int8_t v[16];
};
inline constexpr Iq4Table kIq4Values = {{-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113}};
// whether every one of 16 values lies in [-64, 63] (so that plus 64 they are unsigned bytes below 128)
inline bool small_values(const int8_t* values) {
  bool small = true;
  for (int i = 0; i < 16; ++i) small = small && values[i] >= -64 && values[i] < 64;
  return small;
}
// values + bias as bytes (a path whose dot product multiplies unsigned bytes takes them biased by 128)
inline Iq4Table biased_values(const int8_t* values, int32_t bias) {
  Iq4Table t;
  for (int i = 0; i < 16; ++i) t.v[i] = static_cast<int8_t>(static_cast<uint8_t>(values[i] + bias));
  return t;
}

// Up to this many rows of x a matmul reads each weight byte once (one pass of the rows over a tile), and so
// prefetches the weights as lines not read again (prefetch_weight).
constexpr int64_t kStreamRows = 4;

// x quantized per group of 32 for the quantized matmuls: q [M, K] int8, a (the group's scale), s (int32) and t =
// a * s (float) [M, K / 32] per group, s16 (int16, |s16| <= 2,032) [M, K / 16] per 16 (the sub-block forms'; two
// neighbours read as one int32 are an int16 pair for idot_pairs); nb: K / 64, the 64-blocks the tiles walk. A view
// of memory its owner keeps.
struct QuantizedX {
  int8_t* q;
  float* a;
  float* t;
  int32_t* s;
  int16_t* s16;
  int64_t k, nb;
  bool stream;  // m <= kStreamRows

  // bytes of the buffers for m rows of k columns (each 64-byte aligned), and a view of them at base
  static int64_t bytes(int64_t m, int64_t k) {
    return aligned(m * k) + 3 * aligned(m * k / 32 * 4) + aligned(m * k / 16 * 2);
  }
  static QuantizedX at(void* base, int64_t m, int64_t k) {
    char* p = static_cast<char*>(base);
    int8_t* q = reinterpret_cast<int8_t*>(p);
    float* a = reinterpret_cast<float*>(p += aligned(m * k));
    float* t = reinterpret_cast<float*>(p += aligned(m * k / 32 * 4));
    int32_t* s = reinterpret_cast<int32_t*>(p += aligned(m * k / 32 * 4));
    int16_t* s16 = reinterpret_cast<int16_t*>(p + aligned(m * k / 32 * 4));
    return {q, a, t, s, s16, k, k / 64, m <= kStreamRows};
  }
  static int64_t aligned(int64_t n) { return (n + 63) / 64 * 64; }
};

// One matmul's input prepared for its weight: int8 blocks (quantized weights) or float32 rows xf [M, K]
// (dense weights). A view of memory its owner keeps (64-byte aligned from `at`).
struct Activations {
  QuantizedX q;
  float* xf;

  static int64_t bytes(int64_t m, int64_t k, int64_t bits) {
    return bits == 16 ? QuantizedX::aligned(m * k * 4) : QuantizedX::bytes(m, k);
  }
  static Activations at(void* memory, int64_t m, int64_t k, int64_t bits) {
    char* base = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(memory) + 63) / 64 * 64);
    if (bits == 16) {
      return {QuantizedX{nullptr, nullptr, nullptr, nullptr, nullptr, k, k / 64, m <= kStreamRows},
              reinterpret_cast<float*>(base)};
    }
    return {QuantizedX::at(base, m, k), nullptr};
  }
};

struct Rows {  // where one attention task's keys / values are: a shared prefix's slots, then its own
  const int64_t* prefix;
  int64_t prefix_len;
  const int64_t* own;
  int64_t len;  // prefix_len + own count
  int64_t slot(int64_t t) const { return t < prefix_len ? prefix[t] : own[t - prefix_len]; }
};

struct QueryRows {  // row r of a task's queries (or outputs): base + (r / g) * token_stride + (r % g) * D
  int64_t n, g, token_stride;
  int64_t offset(int64_t r, int64_t d) const { return (r / g) * token_stride + (r % g) * d; }
};

struct Scratch {  // one thread's working memory for attention tasks
  std::vector<float> scores, inv_sum, q;  // q: a task's query rows widened to float32
  std::vector<uint16_t> probs;
};

// The attention tasks [first, count) that all the threads of a parallel region run together, stage by stage
// (the remainder when the tasks do not divide evenly among the threads): task i's scores [r_count, stride] at
// scores + score_at[i - first], its 1 / sums [r_count] at inv_sum + inv_at[i - first]. Zeroed once.
// Thread t runs tasks [bounds[t], bounds[t + 1]) of [0, first) alone, each whole.
struct SharedAttention {
  int64_t first = 0;
  std::vector<int64_t> bounds;
  std::vector<float> scores, inv_sum;
  std::vector<int64_t> score_at, inv_at;
};

// One attention task: n query tokens x the G query heads of KV head `head`, their rows starting at element
// `at` of q and of the output.
struct AttentionTask {
  Rows rows;
  QueryRows qr;
  int64_t at, head;
};

}  // namespace radixlm_cpu

using radixlm_cpu::biased_values;
using radixlm_cpu::small_values;
using radixlm_cpu::Iq4Table;
using radixlm_cpu::kIq4Values;
using radixlm_cpu::kStreamRows;
using radixlm_cpu::QuantizedX;
using radixlm_cpu::sub_block_bytes;
using radixlm_cpu::sub_offset;
using radixlm_cpu::sub_quad_bytes;
using radixlm_cpu::QueryRows;
using radixlm_cpu::Rows;
using radixlm_cpu::Scratch;
using radixlm_cpu::SharedAttention;
