// Logit bias and penalties (repetition, frequency, presence) applied to float32 logits rows in place, bit for bit
// as the Python sampler's torch ops give them (torch reference: sampling.penalize_torch). The fused layers' decode
// groups apply them between their steps, adding each step's token; the sampler calls the op for single steps on
// the CPU, so a request's tokens do not depend on the group.
#include "cpu_isa.h"
#include "cpu_ops.h"

namespace radixlm_cpu {

void RowPenalty::apply(float* logits) const {
  for (const auto& [id, value] : bias) logits[id] = logits[id] + value;
  if (repetition != 1.f) {
    for (const int64_t id : seen) logits[id] = logits[id] > 0.f ? logits[id] / repetition : logits[id] * repetition;
  }
  if (frequency != 0.f || presence != 0.f) {
    for (const auto& [id, n] : counts) logits[id] = logits[id] - (frequency * static_cast<float>(n) + presence);
  }
}

void RowPenalty::add(int64_t token) {
  if (repetition != 1.f) seen.insert(token);
  if (frequency != 0.f || presence != 0.f) ++counts[token];
}

namespace {

// Row r's part [off[r], off[r + 1]) of a packed int64 list, checked against vocab.
std::pair<const int64_t*, int64_t> row_ids(const at::Tensor& ids, const at::Tensor& off, int64_t r, int64_t vocab,
                                           const char* what) {
  const int64_t* o = off.data_ptr<int64_t>();
  TORCH_CHECK(o[r] >= 0 && o[r] <= o[r + 1] && o[r + 1] <= ids.numel(), what, ": bad offsets at row ", r);
  const int64_t* p = ids.data_ptr<int64_t>() + o[r];
  for (int64_t i = 0; i < o[r + 1] - o[r]; ++i) {
    TORCH_CHECK(p[i] >= 0 && p[i] < vocab, what, ": token ", p[i], " is outside the vocabulary of ", vocab);
  }
  return {p, o[r + 1] - o[r]};
}

}  // namespace

std::vector<RowPenalty> row_penalties(at::ArrayRef<double> settings, const std::vector<at::Tensor>& tokens,
                                      int64_t rows, int64_t vocab) {
  TORCH_CHECK(static_cast<int64_t>(settings.size()) == 3 * rows && tokens.size() == 7,
              "penalties: settings [3R] and 7 token tensors (seen, offsets, outputs, offsets, bias ids, values, "
              "offsets)");
  for (const int i : {0, 1, 2, 3, 4, 6}) {
    TORCH_CHECK(tokens[i].scalar_type() == at::kLong && tokens[i].is_contiguous(), "penalties: token tensor ", i,
                " must be contiguous int64");
  }
  for (const int i : {1, 3, 6}) TORCH_CHECK(tokens[i].numel() == rows + 1, "penalties: offsets need R + 1 values");
  TORCH_CHECK(tokens[5].scalar_type() == at::kFloat && tokens[5].numel() == tokens[4].numel(),
              "penalties: bias values must be float32, one per bias id");
  std::vector<RowPenalty> out(rows);
  for (int64_t r = 0; r < rows; ++r) {
    RowPenalty& p = out[r];
    p.repetition = static_cast<float>(settings[3 * r]);
    p.frequency = static_cast<float>(settings[3 * r + 1]);
    p.presence = static_cast<float>(settings[3 * r + 2]);
    TORCH_CHECK(p.repetition > 0.f, "penalties: row ", r, "'s repetition penalty must be positive");
    const auto [seen, ns] = row_ids(tokens[0], tokens[1], r, vocab, "seen");
    p.seen.insert(seen, seen + ns);
    const auto [outs, no] = row_ids(tokens[2], tokens[3], r, vocab, "outputs");
    for (int64_t i = 0; i < no; ++i) ++p.counts[outs[i]];
    const auto [ids, nb] = row_ids(tokens[4], tokens[6], r, vocab, "bias");
    const float* values = tokens[5].data_ptr<float>() + tokens[6].data_ptr<int64_t>()[r];
    for (int64_t i = 0; i < nb; ++i) p.bias.emplace_back(ids[i], values[i]);
  }
  return out;
}

namespace {

// logits [R, N] float32 (the first `cols` columns the vocabulary), in place.
void penalize_rows(at::Tensor& logits, int64_t cols, at::ArrayRef<double> settings,
                   const std::vector<at::Tensor>& tokens) {
  check_logits(logits, cols);
  const std::vector<RowPenalty> rows = row_penalties(settings, tokens, logits.size(0), cols);
  for (int64_t r = 0; r < logits.size(0); ++r) rows[r].apply(logits.data_ptr<float>() + r * logits.stride(0));
}

}  // namespace
}  // namespace radixlm_cpu

TORCH_LIBRARY_FRAGMENT(radixlm_cpu, m) {
  m.def("penalize_rows(Tensor(a!) logits, int cols, float[] settings, Tensor[] tokens) -> ()");
}

TORCH_LIBRARY_IMPL(radixlm_cpu, CPU, m) { m.impl("penalize_rows", &radixlm_cpu::penalize_rows); }
