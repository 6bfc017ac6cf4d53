// A Llama model's decoder layers as one C++ object, from radixlm's CPU kernels, for the quantized models on
// the CPU: eager decode ran ~25 torch ops a layer (several hundred a token, each with Python and dispatch
// around it), which cost more than the matmuls themselves. torch.classes.radixlm_cpu.FusedLayers takes the
// weights and KV pools once; its run() is one call per batch for all layers. The kernels it runs are the
// ops of cpu_matmul, cpu_decode_attention and cpu_norm_act, plus the rotary embedding and KV store of
// cpu_rope_store.cpp. Python reference: runtime/model/llama.py (the same math with torch's ops).
//
// Weights: 21 per layer, norm1 [H], qkv (data, scales, mins), qkv's tail (3), qkv bias (or empty), o (3), norm2
// [H], gate_up (3), gate_up's tail (3), down (3) in cpu_matmul's int4 (uint8 codes, d, mn or empty), int5 (uint8
// codes, d, mn), int6 (uint8 codes, d, unused), int8 (int8 q, d, unused) or dense (float tiles, unused, unused)
// layouts, each matrix its own (a Q4_K_M file mixes them), but all quantized or all dense. A tail (all three
// empty if none) is a stacked matrix's last rows where they come in another width than the rows before them (a
// Q4_K_M file's v in Q6_K after q and k in Q4_K). k_caches, v_caches: the layers' head-major pools [Hkv, S, D].
// cos, sin: the rotary tables [P, D / 2] float32. head: the LM head's (data, scales, mins) in one of the quantized
// layouts, or nothing. run(): x [T, H] the embeddings, overwritten by the last layer's output; positions [T] (rows
// of the tables); loc [T] slots of the new tokens; it returns the logits (float32) of the rows the step wants
// (logit_rows), or without a head the model's final norm of those rows, the LM head's input.
// Attention: request r's slots are row req_rows[r] of table (the requests' slot table), its first seq_lens[r];
// decode (ext_lens empty) one new token a request, extend ext_lens[r] new tokens, the last of its slots.
#include "cpu_isa.h"
#include "cpu_layer_weights.h"
#include "cpu_ops.h"
#include "cpu_phase_clock.h"

#include <omp.h>
#include <torch/custom_class.h>

#include <array>
#include <cmath>
#include <iterator>
#include <optional>

namespace radixlm_cpu {
namespace {

// The buffers every layer of one call reuses, carved from the workspace (grown when a batch needs more). The
// matmul inputs' size depends only on dense or not, which every layer shares. q and attn in the pools' dtype, the
// others in x's: float32 with quantized weights (the sums stay float32 up to the next int8 quantization).
struct LayerBuffers {
  at::Tensor h, qkv, q, attn, o, h2, gu, act;  // [T, H], [T, qkv_n], [T, Hq, D], [T, Hq D], [T, H] x2, ...
  Activations xh, xattn, xh2, xact;            // the matmuls' prepared inputs
};

LayerBuffers carve(at::Tensor& workspace, const at::Tensor& x, at::ScalarType pools, const LayerWeights& lw,
                   int64_t num_heads, int64_t d) {
  const int64_t t = x.size(0), hidden = x.size(1), elem = x.element_size(), pe = at::elementSize(pools);
  const int64_t qkv_n = lw.qkv.n(), q_n = num_heads * d, inter = lw.down.k();
  const int64_t sizes[] = {t * hidden * elem, t * qkv_n * elem, t * q_n * pe, t * q_n * pe, t * hidden * elem,
                           t * hidden * elem, t * 2 * inter * elem, t * inter * elem,
                           Activations::bytes(t, hidden, lw.qkv.bits()), Activations::bytes(t, q_n, lw.o.bits()),
                           Activations::bytes(t, hidden, lw.gate_up.bits()),
                           Activations::bytes(t, inter, lw.down.bits())};
  int64_t total = 64;
  for (int64_t n : sizes) total += QuantizedX::aligned(n);
  if (workspace.numel() < total) workspace.resize_({total});
  char* base = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(workspace.data_ptr<uint8_t>()) + 63) / 64 * 64);
  std::array<char*, std::size(sizes)> buf;
  for (size_t i = 0; i < buf.size(); ++i) {
    buf[i] = base;
    base += QuantizedX::aligned(sizes[i]);
  }
  auto view = [&](int i, at::IntArrayRef shape) { return at::from_blob(buf[i], shape, x.options()); };
  auto pooled = [&](int i, at::IntArrayRef shape) { return at::from_blob(buf[i], shape, x.options().dtype(pools)); };
  return {view(0, {t, hidden}), view(1, {t, qkv_n}), pooled(2, {t, num_heads, d}), pooled(3, {t, q_n}),
          view(4, {t, hidden}), view(5, {t, hidden}), view(6, {t, 2 * inter}), view(7, {t, inter}),
          Activations::at(buf[8], t, hidden, lw.qkv.bits()), Activations::at(buf[9], t, q_n, lw.o.bits()),
          Activations::at(buf[10], t, hidden, lw.gate_up.bits()),
          Activations::at(buf[11], t, inter, lw.down.bits())};
}

// Thread tid's share of y = x W^T for one of the layer's matrices. With a tail (rows in another width) the tiles
// split so that each of the nt threads reads about the same bytes (a tile of the wider part costs more). Tiles
// are computed alone, so the split never changes bits.
void matrix_tiles(const Matrix& m, const Activations& xq, at::Tensor& y, int tid, int nt, int64_t isa) {
  const int64_t nh = m.w.n() / 16;
  if (!m.tail) {
    auto [t0, t1] = thread_part(nh, tid, nt);
    if (t0 < t1) linear_tiles(m.w, xq, t0, t1, y, 0, isa);
    return;
  }
  const int64_t ntl = m.tail->n() / 16;
  const double ch = static_cast<double>(m.w.nbytes()) / nh, ct = static_cast<double>(m.tail->nbytes()) / ntl;
  auto first_tile = [&](int i) -> int64_t {  // thread i's first tile (nh + ntl for i = nt)
    const double c = (nh * ch + ntl * ct) * i / nt;
    return c <= nh * ch ? std::llround(c / ch) : nh + std::min<int64_t>(ntl, std::llround((c - nh * ch) / ct));
  };
  const int64_t b = first_tile(tid), e = first_tile(tid + 1);
  if (b < std::min(e, nh)) linear_tiles(m.w, xq, b, std::min(e, nh), y, 0, isa);
  if (std::max(b, nh) < e) linear_tiles(*m.tail, xq, std::max(b, nh) - nh, e - nh, y, m.w.n(), isa);
}

// What one call's layers share: the batch's inputs and the attention tasks (the same slots in every layer).
struct LayerCall {
  at::Tensor &x, &residual;
  double eps;
  const at::Tensor &cos, &sin, &pos, &loc;
  const std::vector<AttentionTask>& tasks;
  SharedAttention& shared;  // the tasks past shared.first: every thread takes part in each
  int64_t isa;
};

// A norm's inputs besides x, rows [r0, r1) of the residual and the weight, into this core's caches: issued by the
// thread that will norm those rows as it finishes the matmul before the norm, while it waits at the barrier for the
// other threads' tiles (the weights streamed since the last norm evicted these lines). Few rows only.
void prefetch_norm_inputs(const at::Tensor& w, const at::Tensor& residual, int64_t r0, int64_t r1) {
  if (r0 >= r1 || r1 - r0 > kStreamRows) return;
  const char* wd = static_cast<const char*>(w.data_ptr());
  for (int64_t i = 0; i < w.nbytes(); i += 64) __builtin_prefetch(wd + i, 0, 3);
  const int64_t row = residual.size(1) * residual.element_size();
  const char* rd = static_cast<const char*>(residual.data_ptr()) + r0 * row;
  for (int64_t i = 0; i < (r1 - r0) * row; i += 64) __builtin_prefetch(rd + i, 1, 3);
}

// One layer, run by thread tid of nt inside the caller's parallel region: its phases split over the threads
// with a barrier between them. x [T, H] is read in the first phase and overwritten by the last.
void layer_phases(const LayerCall& c, const LayerWeights& lw, const at::Tensor& next_norm, at::Tensor& k_cache,
                  at::Tensor& v_cache, LayerBuffers& b, int tid, int nt, Scratch& scratch, PhaseClock& clock) {
  const int64_t t = c.x.size(0);
  auto [r0, r1] = thread_part(t, tid, nt);
  const CellPart norm_rows{r0, r1, 0, c.x.size(1) / 64};  // whole rows: a row's norm is one reduction
  // the other elementwise phases' cells: RoPE's heads, the matmul inputs' 64-blocks
  const CellPart heads = rope_part(t, b.q.size(1), k_cache.size(0), tid, nt);
  const CellPart attn_blocks = cell_part(t, b.attn.size(1) / 64, tid, nt);
  const CellPart act_blocks = cell_part(t, b.act.size(1) / 64, tid, nt);
  auto tiles = [&](const Matrix& m, const Activations& xq, at::Tensor& y) { matrix_tiles(m, xq, y, tid, nt, c.isa); };
  if (!norm_rows.empty()) {
    rms_norm_range(c.x, &c.residual, lw.norm1, c.eps, r0, r1, b.h, c.isa);
    prepare_range(b.h, norm_rows, b.xh, lw.qkv.bits(), c.isa);
  }
  clock.barrier(0);
  tiles(lw.qkv, b.xh, b.qkv);
  clock.barrier(1);
  if (!heads.empty()) {
    rope_store_range(b.qkv, lw.bias, c.cos, c.sin, c.pos, k_cache, v_cache, c.loc, heads, b.q, c.isa);
  }
  clock.barrier(2);
  auto [a0, a1] = own_tasks(c.shared, tid, nt);
  if (a0 < a1) run_attention(c.tasks, b.q, k_cache, v_cache, b.attn, a0, a1, scratch, c.isa);
  run_shared_attention(c.tasks, b.q, k_cache, v_cache, b.attn, c.shared, tid, nt, scratch, c.isa);
  clock.barrier(3);
  if (!attn_blocks.empty()) prepare_range(b.attn, attn_blocks, b.xattn, lw.o.bits(), c.isa);
  clock.barrier(4);
  tiles(lw.o, b.xattn, b.o);
  prefetch_norm_inputs(lw.norm2, c.residual, r0, r1);
  clock.barrier(5);
  if (!norm_rows.empty()) {
    rms_norm_range(b.o, &c.residual, lw.norm2, c.eps, r0, r1, b.h2, c.isa);
    prepare_range(b.h2, norm_rows, b.xh2, lw.gate_up.bits(), c.isa);
  }
  clock.barrier(6);
  tiles(lw.gate_up, b.xh2, b.gu);
  clock.barrier(7);
  if (!act_blocks.empty()) {
    const CellPart& a = act_blocks;
    silu_mul_range(b.gu, a.r0, a.r1, a.u0 * 64, a.u1 * 64, b.act, c.isa);
    prepare_range(b.act, a, b.xact, lw.down.bits(), c.isa);
  }
  clock.barrier(8);
  tiles(lw.down, b.xact, c.x);
  prefetch_norm_inputs(next_norm, c.residual, r0, r1);
}

}  // namespace

// A model's layers, given once (weights and pools), run by one call per batch in one parallel region with
// a barrier between layers: converting the ~450 weight tensors of a call from Python and a region and a
// call per layer cost more than several of a layer's kernels at batch 1.
class FusedLayers : public torch::CustomClassHolder {
 public:
  FusedLayers(std::vector<at::Tensor> weights, at::Tensor final_norm, std::vector<at::Tensor> k_caches,
              std::vector<at::Tensor> v_caches, double eps, int64_t num_heads, at::Tensor cos, at::Tensor sin,
              std::vector<at::Tensor> head)
      : w_(std::move(weights)), final_norm_(std::move(final_norm)), k_(std::move(k_caches)), v_(std::move(v_caches)),
        eps_(eps), num_heads_(num_heads), cos_(std::move(cos)), sin_(std::move(sin)),
        workspace_(at::empty({0}, at::kByte)) {
    const int64_t layers = static_cast<int64_t>(k_.size());
    TORCH_CHECK(layers >= 1 && static_cast<int64_t>(w_.size()) == kWeights * layers && v_.size() == k_.size(),
                "weights: expected ", kWeights, " tensors per layer for ", layers, " layers, got ", w_.size());
    check_pools(k_[0], v_[0], cos_, sin_, num_heads);
    for (int64_t i = 0; i < layers; ++i) {
      TORCH_CHECK(k_[i].dim() == 3 && k_[i].sizes() == k_[0].sizes() && v_[i].sizes() == k_[0].sizes() &&
                  k_[i].scalar_type() == k_[0].scalar_type() && v_[i].scalar_type() == k_[0].scalar_type(),
                  "every layer's pools must be [Hkv, S, D] of one shape and dtype");
      lw_.push_back(layer_weights(w_, i));
      check_layer_weights(lw_.back(), w_[0].numel(), k_[0].scalar_type(), num_heads, k_[0].size(0), k_[0].size(2),
                          weight_bits(w_[1]) == 16);
    }
    TORCH_CHECK(final_norm_.sizes() == w_[0].sizes() && final_norm_.scalar_type() == w_[0].scalar_type() &&
                final_norm_.is_contiguous(), "the final norm's weight must be [H] in the pools' dtype");
    if (!head.empty()) head_ = lm_head(head, w_[0].numel());
  }

  // x [T, H] the embeddings (overwritten); the first num_layers layers, then the final norm of rows logit_rows [R]
  // (increasing) -> their logits [R, N] float32, or without a head the final norm [R, H], the LM head's input.
  at::Tensor run(at::Tensor x, at::Tensor positions, at::Tensor loc, at::Tensor table, at::Tensor req_rows,
                 at::Tensor seq_lens, at::Tensor ext_lens, int64_t num_layers, at::Tensor logit_rows, int64_t isa) {
    check_isa(isa);
    TORCH_CHECK(num_layers >= 1 && num_layers <= static_cast<int64_t>(k_.size()), "num_layers must be 1-",
                k_.size(), ", got ", num_layers);
    check_call(x, positions, loc, k_[0], cos_.size(0));
    check_requests(table, req_rows, seq_lens, ext_lens, x.size(0));
    TORCH_CHECK(x.size(1) == w_[0].numel(), "x must be [T, ", w_[0].numel(), "], got ", x.sizes());
    // the residual stream in float32, as llama.cpp keeps it, and with quantized weights the activations between
    // the kernels too (benchmarks/bench_fidelity.py measures the difference)
    at::Tensor residual = at::zeros(x.sizes(), x.options().dtype(at::kFloat));
    check_logit_rows(logit_rows, x.size(0));
    if (lw_[0].qkv.w.bits != 16) x = x.to(at::kFloat);
    LayerBuffers buffers = carve(workspace_, x, k_[0].scalar_type(), lw_[0], num_heads_, k_[0].size(2));
    const std::vector<AttentionTask> tasks =
        ext_lens.numel() == 0 ? decode_tasks(buffers.q, k_[0], table, seq_lens, at::Tensor(), at::Tensor(), req_rows)
                              : extend_tasks(buffers.q, k_[0], table, seq_lens, ext_lens, req_rows);
    SharedAttention shared = plan_shared_attention(tasks, at::get_num_threads(), isa);
    const LayerCall call{x, residual, eps_, cos_, sin_, positions, loc, tasks, shared, isa};
    const int threads = at::get_num_threads();
    if (profiling_ && static_cast<int64_t>(profile_.size()) < threads * 2 * kLayerPhases) {
      profile_.resize(threads * 2 * kLayerPhases, 0.0);
    }
#pragma omp parallel num_threads(threads)
    {
      const int tid = omp_get_thread_num(), nt = omp_get_num_threads();
      Scratch scratch;
      PhaseClock clock(profiling_ ? profile_.data() + tid * 2 * kLayerPhases : nullptr);
      for (int64_t i = 0; i < num_layers; ++i) {
        const at::Tensor& next_norm = i + 1 < num_layers ? lw_[i + 1].norm1 : final_norm_;
        layer_phases(call, lw_[i], next_norm, k_[i], v_[i], buffers, tid, nt, scratch, clock);
        i + 1 < num_layers ? clock.barrier(kLayerPhases - 1) : clock.done(kLayerPhases - 1);
      }
    }
    at::Tensor h = final_norm(x, residual, logit_rows, isa);
    if (!head_) return h;
    const auto start = std::chrono::steady_clock::now();
    at::Tensor logits = linear_logits(h, *head_, isa);
    if (profiling_) {
      head_us_ += std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
    }
    return logits;
  }

  // Decode steps back to back, in one call (needs the head): ids [B] each request's last token at positions [B],
  // locs [B, K] its next K slots, seq_lens [B] its KV length after step 0. Step k feeds row b its token of step
  // k - 1, chosen from that step's first `vocab` logits at position positions[b] + k, as K calls of run() would
  // -> tokens int64 [B, K]. embed: the embedding table, [V, H] in the pools' dtype or an int8 table's (q, d).
  // u: empty for the argmax of every row, else each row's uniforms [B, K] float64 for sample_rows with its
  // temperature, top_k, top_p and min_p (step k draws with u[:, k]). penalty_settings and penalty_tokens: empty, or
  // the rows' bias and penalties packed (row_penalties), applied before each choice and given each step's token.
  // raw: empty, or float32 [K, A, vocab]: each step's logits of rows raw_rows (int64 [A]) as the head gave them.
  at::Tensor decode_steps(at::Tensor ids, at::Tensor positions, at::Tensor locs, at::Tensor table, at::Tensor req_rows,
                          at::Tensor seq_lens, std::vector<at::Tensor> embed, int64_t vocab,
                          std::vector<double> temperature, std::vector<int64_t> top_k, std::vector<double> top_p,
                          std::vector<double> min_p, at::Tensor u, std::vector<double> penalty_settings,
                          std::vector<at::Tensor> penalty_tokens, at::Tensor raw, at::Tensor raw_rows,
                          int64_t isa) {
    TORCH_CHECK(head_, "decode_steps: the LM head must be inside the call");
    TORCH_CHECK(ids.dim() == 1 && ids.scalar_type() == at::kLong && locs.dim() == 2 && locs.size(0) == ids.numel() &&
                locs.scalar_type() == at::kLong, "ids must be int64 [B] and locs int64 [B, K]");
    TORCH_CHECK(embed.size() == 1 || embed.size() == 2, "embed: the table, or an int8 table's q and d");
    TORCH_CHECK(u.numel() == 0 || (u.dim() == 2 && u.size(0) == ids.numel() && u.size(1) == locs.size(1) &&
                                   u.scalar_type() == at::kDouble),
                "u must be empty or float64 [B, K]");
    TORCH_CHECK(raw.numel() == 0 || (raw_rows.dim() == 1 && raw_rows.scalar_type() == at::kLong &&
                                     raw.sizes() == at::IntArrayRef({locs.size(1), raw_rows.numel(), vocab})),
                "raw must be empty or [K, A, vocab] for raw_rows int64 [A]");
    const int64_t b = ids.numel();
    std::vector<RowPenalty> penalties;
    if (!penalty_settings.empty()) penalties = row_penalties(penalty_settings, penalty_tokens, b, vocab);
    at::Tensor tokens = at::empty({b, locs.size(1)}, at::kLong), cur = ids, rows = at::arange(b, at::kLong);
    for (int64_t k = 0; k < locs.size(1); ++k) {
      at::Tensor x = embed.size() == 2 ? int8_rows(embed[0], embed[1], cur, w_[0].scalar_type())
                                       : embed[0].index_select(0, cur);
      at::Tensor logits = run(x, positions + k, locs.select(1, k).contiguous(), table, req_rows, seq_lens + k,
                              at::empty({0}, at::kLong), static_cast<int64_t>(k_.size()), rows, isa);
      at::Tensor raw_k = raw.numel() > 0 ? raw.select(0, k) : raw;  // this step's kept rows, or nothing to keep
      if (raw.numel() > 0) at::index_select_out(raw_k, logits.narrow(1, 0, vocab), 0, raw_rows);  // one copy
      for (int64_t r = 0; r < static_cast<int64_t>(penalties.size()); ++r)
        penalties[r].apply(logits.data_ptr<float>() + r * logits.stride(0));
      if (u.numel() == 0) {
        cur = argmax_rows(logits, vocab);
      } else {
        const at::Tensor col = u.select(1, k).contiguous();
        cur = sample_rows(logits, vocab, temperature, top_k, top_p, min_p,
                          at::ArrayRef<double>(col.data_ptr<double>(), b), isa);
      }
      tokens.select(1, k).copy_(cur);
      for (int64_t r = 0; r < static_cast<int64_t>(penalties.size()); ++r) penalties[r].add(cur.data_ptr<int64_t>()[r]);
    }
    return tokens;
  }

  // Where run()'s time goes (cpu_phase_clock.h): on starts a profile (sums zeroed), off stops it.
  void set_profiling(bool on) {
    profiling_ = on;
    profile_.assign(profile_.size(), 0.0);
    head_us_ = 0.0;
  }

  // The profile's sums since set_profiling(true): float64 [threads, 2, kLayerPhases + 1], work then wait,
  // microseconds; the last phase is the LM head's, after the layers, timed on the calling thread (row 0)
  at::Tensor phase_profile() const {
    const int64_t threads = static_cast<int64_t>(profile_.size()) / (2 * kLayerPhases);
    at::Tensor out = at::zeros({threads, 2, kLayerPhases + 1}, at::kDouble);
    if (threads == 0) return out;
    out.narrow(2, 0, kLayerPhases).copy_(at::tensor(profile_, at::kDouble).view({threads, 2, kLayerPhases}));
    out[0][0][kLayerPhases] = head_us_;
    return out;
  }

 private:
  static void check_logit_rows(const at::Tensor& logit_rows, int64_t t) {
    TORCH_CHECK(logit_rows.dim() == 1 && logit_rows.scalar_type() == at::kLong && logit_rows.is_contiguous(),
                "logit_rows must be a contiguous int64 [R] tensor");
    const int64_t* lr = logit_rows.data_ptr<int64_t>();
    for (int64_t i = 0; i < logit_rows.numel(); ++i) {
      TORCH_CHECK(lr[i] >= (i > 0 ? lr[i - 1] + 1 : 0) && lr[i] < t, "logit_rows must increase within the batch's ",
                  t, " rows");
    }
  }

  // out row i = rms_norm(x + residual) of row logit_rows[i], as the model's add_rms_norm_ gives it (a row of x
  // and residual is read and written once: the rows increase, check_logit_rows)
  at::Tensor final_norm(const at::Tensor& x, at::Tensor& residual, const at::Tensor& logit_rows, int64_t isa) const {
    // in the pools' dtype: the LM head's input, inside the call or the model's own head's
    at::Tensor out = at::empty({logit_rows.numel(), x.size(1)}, x.options().dtype(final_norm_.scalar_type()));
    const int64_t* lr = logit_rows.data_ptr<int64_t>();
    for (int64_t i = 0; i < logit_rows.numel(); ++i) {
      at::Tensor res = residual.narrow(0, lr[i], 1), o = out.narrow(0, i, 1);
      rms_norm_range(x.narrow(0, lr[i], 1), &res, final_norm_, eps_, 0, 1, o, isa);
    }
    return out;
  }

  std::vector<at::Tensor> w_;  // 21 weights per layer
  std::vector<LayerWeights> lw_;  // views of w_, built once (a call's threads would copy 21 tensors a layer)
  at::Tensor final_norm_;      // [H]
  at::Tensor cos_, sin_;       // the rotary tables [P, D / 2]
  std::optional<QuantWeightRef> head_;  // the LM head, when the call computes the logits
  std::vector<at::Tensor> k_, v_;  // the layers' K and V pools
  double eps_;
  int64_t num_heads_;
  at::Tensor workspace_;  // the layers' buffers (carve), grown to the largest batch
  bool profiling_ = false;
  std::vector<double> profile_;  // [threads, 2, kLayerPhases] while profiling (phase_profile)
  double head_us_ = 0.0;         // the LM head's time while profiling
};

}  // namespace radixlm_cpu

TORCH_LIBRARY_FRAGMENT(radixlm_cpu, m) {
  m.class_<radixlm_cpu::FusedLayers>("FusedLayers")
      .def(torch::init<std::vector<at::Tensor>, at::Tensor, std::vector<at::Tensor>, std::vector<at::Tensor>, double,
                       int64_t, at::Tensor, at::Tensor, std::vector<at::Tensor>>())
      .def("run", &radixlm_cpu::FusedLayers::run)
      .def("decode_steps", &radixlm_cpu::FusedLayers::decode_steps)
      .def("set_profiling", &radixlm_cpu::FusedLayers::set_profiling)
      .def("phase_profile", &radixlm_cpu::FusedLayers::phase_profile);
}
