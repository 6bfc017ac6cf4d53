// Where a fused decoder-layer call's time goes, per thread and phase (cpu_decoder_layer.cpp): a phase's work
// (from its start to the thread's arrival at the barrier that ends it) and the wait at that barrier, in
// microseconds, summed over the calls of a profile. Off (no row), a phase's end is only the barrier.
#pragma once

#include <chrono>

namespace radixlm_cpu {

constexpr int kLayerPhases = 10;  // norm, qkv, RoPE + KV store, attention, its prepare, o, norm 2, gate_up, silu, down

// One thread's clock inside a parallel region; row: its [2, kLayerPhases] sums (work, then wait), or null.
class PhaseClock {
 public:
  explicit PhaseClock(double* row) : row_(row), last_(row != nullptr ? now() : 0) {}

  // the thread's part of phase `phase` is done: wait for the others (every thread calls it)
  void barrier(int phase) {
    done(phase);
#pragma omp barrier
    if (row_ != nullptr) {
      const double t = now();
      row_[kLayerPhases + phase] += t - last_;
      last_ = t;
    }
  }

  // the thread's part of phase `phase` is done, no barrier follows (the call's last phase)
  void done(int phase) {
    if (row_ == nullptr) return;
    const double t = now();
    row_[phase] += t - last_;
    last_ = t;
  }

 private:
  static double now() {
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
  }
  double* row_;
  double last_;
};

}  // namespace radixlm_cpu
