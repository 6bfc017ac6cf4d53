// Choosing each row's token from float32 logits [R, N] (their first `cols` columns): argmax_rows (greedy) and
// sample_rows (temperature, top-k / top-p / min-p, then inverse transform sampling with one given uniform u a
// row); and logprob_rows, a chosen token's log-softmax and a row's top ones. The fused layers' decode-step groups
// call them between their steps, and the Python sampler calls them for single steps on the CPU, so a request's
// tokens (and logprobs) are the same either way. Torch references: sampling.py (sample_rows_torch,
// row_logprobs_torch); the exponentials' body: cpu_sample_body.h.
//
// sample_rows, one row: x = logits * (1 / t), p = softmax(x). A row with no filter (top_k 0, top_p >= 1, min_p 0)
// draws over the vocabulary in column order; a row with one ranks the tokens by p (ties: the lower column first) and
// keeps the prefix of the ranking whose rank is below top_k, whose mass before it is below top_p, and whose p is at
// least min_p times the top p (the first always stays), then draws among them in rank order. The draw: the
// first column whose running sum of weights exceeds u times their total. A row with t = 0 takes the argmax; a row
// with a NaN or infinite maximum (nothing to normalize) takes the argmax too (a NaN counting as the maximum).
#include "cpu_isa.h"
#include "cpu_ops.h"

#define RADIXLM_BODY "cpu_sample_body.h"
#include "cpu_foreach_isa.h"

namespace radixlm_cpu {
namespace {

// A weight e below this (p below e^-69 of the top's) counts as 0: a -inf logit's clamped exponential never draws.
constexpr float kNegligible = 1e-30f;
constexpr int64_t kBlock = 256;  // the columns of a block (exp_blocks' sums and maxima; a thread's unit)
constexpr float kCuts[] = {1.f / 4096, 1.f / 16777216};  // the weights a ranked candidate needs, tried in turn

// The largest of v[0, cols) and whether a NaN is among them, in one vectorized pass.
float row_max(const float* v, int64_t cols, bool& any_nan) {
  float top = -INFINITY;
  int nan = 0;
#pragma omp simd reduction(max : top) reduction(| : nan)
  for (int64_t c = 0; c < cols; ++c) {
    top = v[c] > top ? v[c] : top;
    nan |= v[c] != v[c];
  }
  any_nan = nan != 0;
  return top;
}

// The first c in [c0, cols) with v[c] == x (for x NaN: v[c] NaN), found 64 columns at a time.
int64_t first_equal(const float* v, int64_t c0, int64_t cols, float x) {
  const bool nan = x != x;
  for (; c0 + 64 <= cols; c0 += 64) {
    int found = 0;
    if (nan) {
#pragma omp simd reduction(| : found)
      for (int64_t j = 0; j < 64; ++j) found |= v[c0 + j] != v[c0 + j];
    } else {
#pragma omp simd reduction(| : found)
      for (int64_t j = 0; j < 64; ++j) found |= v[c0 + j] == x;
    }
    if (found) break;
  }
  while (nan ? v[c0] == v[c0] : v[c0] != x) ++c0;
  return c0;
}

// The first index of a row's maximum among v[0, cols), a NaN counting as the maximum.
int64_t argmax_row(const float* v, int64_t cols) {
  bool nan = false;
  const float top = row_max(v, cols, nan);
  return first_equal(v, 0, cols, nan ? NAN : top);
}

struct RowDraw {  // one row's settings
  float t;
  int64_t top_k;
  float top_p, min_p;
  double u;
  bool filtered() const { return top_k > 0 || top_p < 1.f || min_p > 0.f; }
};

struct Weights {  // one row's exponentials: e [cols], per kBlock-column block their sum and maximum
  std::vector<float> e, bsum, bmax;
  double total = 0;  // the sum of bsum, in order
};

// The target of a draw over weights of this total: u times it, kept below it.
double draw_target(double u, double total) { return std::min(u * total, std::nextafter(total, 0.0)); }

// The first column whose running sum (in column order, weights below kNegligible counting 0) exceeds the target,
// found block by block; rounding apart, the last column of weight that was passed.
int64_t draw_in_order(const Weights& w, double u) {
  const double target = draw_target(u, w.total);
  const int64_t cols = static_cast<int64_t>(w.e.size());
  double run = 0;
  int64_t last = -1;
  for (int64_t b = 0; b * kBlock < cols; ++b) {
    if (run + w.bsum[b] <= target) {
      run += w.bsum[b];
      continue;
    }
    double acc = run;
    for (int64_t j = b * kBlock; j < std::min(cols, (b + 1) * kBlock); ++j) {
      if (w.e[j] < kNegligible) continue;
      acc += w.e[j];
      last = j;
      if (acc > target) return j;
    }
    run += w.bsum[b];
  }
  return last;
}

using Candidate = std::pair<float, int64_t>;  // (weight, column)

bool ranks_before(const Candidate& a, const Candidate& b) {  // by weight down, then column up
  return a.first > b.first || (a.first == b.first && a.second < b.second);
}

// The columns with weight at least `cut`, in column order.
std::vector<Candidate> candidates(const Weights& w, float cut) {
  std::vector<Candidate> out;
  const int64_t cols = static_cast<int64_t>(w.e.size());
  for (int64_t b = 0; b * kBlock < cols; ++b) {
    if (w.bmax[b] < cut) continue;
    for (int64_t j = b * kBlock; j < std::min(cols, (b + 1) * kBlock); ++j) {
      if (w.e[j] >= cut) out.emplace_back(w.e[j], j);
    }
  }
  return out;
}

// How many of the first n ranked candidates the filters keep (a prefix; the first always stays).
int64_t kept_prefix(const std::vector<Candidate>& ranked, int64_t n, const RowDraw& d, double total) {
  const double mass_cut = static_cast<double>(d.top_p) * total;
  const float p_cut = d.min_p * ranked[0].first;
  double before = 0;
  int64_t kept = 1;
  for (; kept < n; ++kept) {
    before += ranked[kept - 1].first;
    if ((d.top_k > 0 && kept >= d.top_k) || before >= mass_cut || ranked[kept].first < p_cut) break;
  }
  return kept;
}

// The draw among the first `kept` ranked candidates, in rank order.
int64_t draw_among(const std::vector<Candidate>& ranked, int64_t kept, double u) {
  double total = 0;
  for (int64_t i = 0; i < kept; ++i) total += ranked[i].first;
  const double target = draw_target(u, total);
  double acc = 0;
  for (int64_t i = 0; i < kept; ++i) {
    acc += ranked[i].first;
    if (acc > target) return ranked[i].second;
  }
  return ranked[kept - 1].second;
}

// A filtered row's draw. The candidates above a weight cut are ranked a prefix at a time (top_k + 1, else 256,
// then 16 times more) until the filters drop one of the ranked: no token after it can stay. Where they keep
// every candidate, the cut is lowered (no token below it can rank before a candidate), down to min_p's own
// cut or kNegligible.
int64_t draw_ranked(const Weights& w, const RowDraw& d) {
  const float floor = std::max(d.min_p, kNegligible);  // the top weight is exp(0) = 1: min_p's cut is min_p itself
  for (int attempt = 0;; ++attempt) {
    const float cut = attempt < 2 ? std::max(kCuts[attempt], floor) : floor;
    std::vector<Candidate> ranked = candidates(w, cut);
    const int64_t count = static_cast<int64_t>(ranked.size());
    int64_t sorted = std::min<int64_t>(d.top_k > 0 ? d.top_k + 1 : 256, count);
    for (;;) {
      std::partial_sort(ranked.begin(), ranked.begin() + sorted, ranked.end(), ranks_before);
      const int64_t kept = kept_prefix(ranked, sorted, d, w.total);
      if (kept < sorted) return draw_among(ranked, kept, d.u);
      if (sorted == count) break;
      sorted = std::min(count, sorted * 16);
    }
    if (cut <= floor) return draw_among(ranked, count, d.u);
  }
}

// The largest of row[0, cols) and whether a NaN is among them; split: over torch's threads, block by block.
float split_max(const float* row, int64_t cols, bool split, bool& any_nan) {
  if (!split) return row_max(row, cols, any_nan);
  const int64_t blocks = (cols + kBlock - 1) / kBlock;
  std::vector<float> tops(blocks);
  std::vector<char> nans(blocks);
  at::parallel_for(0, blocks, 16, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      bool nan = false;
      tops[b] = row_max(row + b * kBlock, std::min(kBlock, cols - b * kBlock), nan);
      nans[b] = nan;
    }
  });
  any_nan = std::find(nans.begin(), nans.end(), 1) != nans.end();
  return *std::max_element(tops.begin(), tops.end());
}

// One row's token. split: the row's passes over its columns run on torch's threads (a batch of one row); the
// blocks are the same either way, so the token is too.
int64_t sample_row(const float* row, int64_t cols, const RowDraw& d, Weights& w, bool split, int64_t isa) {
  bool nan = false;
  const float top = split_max(row, cols, split, nan);
  if (d.t == 0.f || nan || !std::isfinite(top)) return first_equal(row, 0, cols, nan ? NAN : top);
  const int64_t blocks = (cols + kBlock - 1) / kBlock;
  w.e.resize(cols);
  w.bsum.resize(blocks);
  w.bmax.resize(blocks);
  const float scale = 1.f / d.t, m = top * scale;  // the largest of row * scale: the product is monotonic
  auto part = [&](int64_t b0, int64_t b1) {
    RADIXLM_ISA_CALL(isa, exp_blocks, row, scale, m, b0 * kBlock, std::min(cols, b1 * kBlock), cols, w.e.data(),
                     w.bsum.data(), w.bmax.data());
  };
  if (split) {
    at::parallel_for(0, blocks, 16, part);
  } else {
    part(0, blocks);
  }
  w.total = 0;
  for (int64_t b = 0; b < blocks; ++b) w.total += w.bsum[b];
  const int64_t pick = d.filtered() ? draw_ranked(w, d) : draw_in_order(w, d.u);
  return pick >= 0 ? pick : first_equal(row, 0, cols, top);
}

// Each row r of [0, rows) through one(r, ...) on torch's threads (a single row on the calling thread).
template <typename F>
void each_row(int64_t rows, const F& one) {
  if (rows == 1) {
    one(0, 1);
  } else {
    at::parallel_for(0, rows, 1, one);
  }
}

// The n largest of row[0, cols) by value, then column (the lower first), as (value, column), largest first (NaNs
// never rank); a 64-column chunk whose largest is not above the n-th so far is skipped (a tie there would lose).
std::vector<Candidate> top_columns(const float* row, int64_t cols, int64_t n) {
  std::vector<Candidate> top;
  top.reserve(n + 1);
  for (int64_t c0 = 0; c0 < cols && n > 0; c0 += 64) {
    const int64_t c1 = std::min(cols, c0 + 64);
    bool nan = false;
    if (static_cast<int64_t>(top.size()) == n && row_max(row + c0, c1 - c0, nan) <= top.back().first) continue;
    for (int64_t c = c0; c < c1; ++c) {
      if (row[c] != row[c] || (static_cast<int64_t>(top.size()) == n && row[c] <= top.back().first)) continue;
      top.insert(std::upper_bound(top.begin(), top.end(), Candidate{row[c], c}, ranks_before), Candidate{row[c], c});
      if (static_cast<int64_t>(top.size()) > n) top.pop_back();
    }
  }
  return top;
}

// log(sum exp(row - top)) over row[0, cols): the block sums of exp_blocks, added in double (split: the blocks on
// torch's threads; the sums are the same either way).
float log_sum_exp_shifted(const float* row, int64_t cols, float top, Weights& w, bool split, int64_t isa) {
  const int64_t blocks = (cols + kBlock - 1) / kBlock;
  w.e.resize(cols);
  w.bsum.resize(blocks);
  w.bmax.resize(blocks);
  auto part = [&](int64_t b0, int64_t b1) {
    RADIXLM_ISA_CALL(isa, exp_blocks, row, 1.f, top, b0 * kBlock, std::min(cols, b1 * kBlock), cols, w.e.data(),
                     w.bsum.data(), w.bmax.data());
  };
  if (split) {
    at::parallel_for(0, blocks, 16, part);
  } else {
    part(0, blocks);
  }
  double total = 0;
  for (int64_t b = 0; b < blocks; ++b) total += w.bsum[b];
  return static_cast<float>(std::log(total));
}

}  // namespace

void check_logits(const at::Tensor& logits, int64_t cols) {
  TORCH_CHECK(logits.dim() == 2 && logits.scalar_type() == at::kFloat && logits.stride(1) == 1,
              "logits must be float32 [R, N] with contiguous rows");
  TORCH_CHECK(cols >= 1 && cols <= logits.size(1), "cols must be 1-", logits.size(1), ", got ", cols);
}

at::Tensor argmax_rows(const at::Tensor& logits, int64_t cols) {
  check_logits(logits, cols);
  at::Tensor out = at::empty({logits.size(0)}, at::kLong);
  each_row(logits.size(0), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      out.data_ptr<int64_t>()[r] = argmax_row(logits.data_ptr<float>() + r * logits.stride(0), cols);
    }
  });
  return out;
}

at::Tensor sample_rows(const at::Tensor& logits, int64_t cols, at::ArrayRef<double> temperature,
                       at::ArrayRef<int64_t> top_k, at::ArrayRef<double> top_p, at::ArrayRef<double> min_p,
                       at::ArrayRef<double> u, int64_t isa) {
  check_isa(isa);
  check_logits(logits, cols);
  const int64_t rows = logits.size(0);
  for (const auto size : {temperature.size(), top_k.size(), top_p.size(), min_p.size(), u.size()}) {
    TORCH_CHECK(static_cast<int64_t>(size) == rows, "temperature, top_k, top_p, min_p and u need one value per logits "
                "row (", rows, "), got ", size);
  }
  std::vector<RowDraw> draws(rows);
  for (int64_t r = 0; r < rows; ++r) {
    draws[r] = {static_cast<float>(temperature[r]), top_k[r], static_cast<float>(top_p[r]),
                static_cast<float>(min_p[r]), u[r]};
    TORCH_CHECK(draws[r].t >= 0.f && draws[r].u >= 0.0 && draws[r].u < 1.0 && draws[r].min_p <= 1.f, "row ", r,
                ": temperature must be >= 0, u in [0, 1) and min_p at most 1");
  }
  at::Tensor out = at::empty({rows}, at::kLong);
  each_row(rows, [&](int64_t r0, int64_t r1) {
    Weights w;
    for (int64_t r = r0; r < r1; ++r) {
      out.data_ptr<int64_t>()[r] =
          sample_row(logits.data_ptr<float>() + r * logits.stride(0), cols, draws[r], w, rows == 1, isa);
    }
  });
  return out;
}

// Each row's log-softmax over its first cols columns, (x - max) - log(sum exp(x - max)), at its token and at its
// top n columns (by logit, ties: the lower column first) -> (chosen float32 [R], ids int64 [R, n], values float32
// [R, n]). A row whose largest logit is NaN or infinite has NaN or -inf values, as torch's log_softmax gives.
std::tuple<at::Tensor, at::Tensor, at::Tensor> logprob_rows(const at::Tensor& logits, int64_t cols,
                                                            at::ArrayRef<int64_t> tokens, int64_t n, int64_t isa) {
  check_isa(isa);
  check_logits(logits, cols);
  const int64_t rows = logits.size(0);
  TORCH_CHECK(static_cast<int64_t>(tokens.size()) == rows, "tokens need one per logits row (", rows, "), got ",
              tokens.size());
  TORCH_CHECK(n >= 0 && n <= cols, "n must be 0-", cols, ", got ", n);
  for (const int64_t t : tokens) TORCH_CHECK(t >= 0 && t < cols, "token ", t, " is outside the ", cols, " columns");
  at::Tensor chosen = at::empty({rows}, at::kFloat), ids = at::empty({rows, n}, at::kLong);
  at::Tensor vals = at::empty({rows, n}, at::kFloat);
  each_row(rows, [&](int64_t r0, int64_t r1) {
    Weights w;
    for (int64_t r = r0; r < r1; ++r) {
      const float* row = logits.data_ptr<float>() + r * logits.stride(0);
      bool nan = false;
      const float top = split_max(row, cols, rows == 1, nan);
      const bool finite = std::isfinite(top) && !nan;
      const float shift = nan ? NAN : top, lse = finite ? log_sum_exp_shifted(row, cols, top, w, rows == 1, isa) : 0.f;
      chosen.data_ptr<float>()[r] = (row[tokens[r]] - shift) - lse;
      const std::vector<Candidate> best = top_columns(row, cols, n);
      for (int64_t i = 0; i < static_cast<int64_t>(best.size()); ++i) {
        ids.data_ptr<int64_t>()[r * n + i] = best[i].second;
        vals.data_ptr<float>()[r * n + i] = (best[i].first - shift) - lse;
      }
      for (int64_t i = static_cast<int64_t>(best.size()); i < n; ++i) {  // fewer than n columns are not NaN
        ids.data_ptr<int64_t>()[r * n + i] = i;
        vals.data_ptr<float>()[r * n + i] = NAN;
      }
    }
  });
  return {chosen, ids, vals};
}

}  // namespace radixlm_cpu

TORCH_LIBRARY_FRAGMENT(radixlm_cpu, m) {
  m.def("argmax_rows(Tensor logits, int cols) -> Tensor");
  m.def("sample_rows(Tensor logits, int cols, float[] temperature, int[] top_k, float[] top_p, float[] min_p, "
        "float[] u, int isa) -> Tensor");
  m.def("logprob_rows(Tensor logits, int cols, int[] tokens, int n, int isa) -> (Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(radixlm_cpu, CPU, m) {
  m.impl("argmax_rows", &radixlm_cpu::argmax_rows);
  m.impl("sample_rows", &radixlm_cpu::sample_rows);
  m.impl("logprob_rows", &radixlm_cpu::logprob_rows);
}
