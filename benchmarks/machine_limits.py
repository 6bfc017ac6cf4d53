"""The physical limits of this machine for single-stream decode: memory read bandwidth (measured), the weight
bytes a decode step reads, and the decode-rate ceiling that follows.

    python benchmarks/machine_limits.py [--model FILE.gguf] [--mb 1024 --repeats 7]

Bandwidth: a C++ loop that reads a large buffer with 32-byte loads on all of torch's threads (the way the
kernels read weights), best of several passes; a tensor copy (read + write) for comparison. A decode step
at batch 1 reads every weight once (the LM head included; the tied embedding's lookup reads one row), so
ceiling tok/s = read bandwidth / weight bytes, per weight format.
"""

from __future__ import annotations

import argparse
import time

import torch
from harness import cpu_description

from radixlm.runtime.model.loader import open_model

READ_KERNEL = r"""
#include <torch/extension.h>
#include <cstdint>
// Sums the buffer with 16 independent accumulators (no dependency chain; the compiler vectorizes them).
int64_t read_all(const at::Tensor& buffer) {
  const int64_t n = buffer.numel();
  const int64_t* p = buffer.data_ptr<int64_t>();
  int64_t total = 0;
#pragma omp parallel reduction(+ : total)
  {
    int64_t acc[16] = {0};
#pragma omp for schedule(static)
    for (int64_t i = 0; i < n; i += 16) {
      for (int j = 0; j < 16; ++j) acc[j] += p[i + j];
    }
    for (int j = 0; j < 16; ++j) total += acc[j];
  }
  return total;
}
"""


def read_bandwidth(mb: int, repeats: int) -> float:
    """bytes/s read by a sum over a buffer of ``mb`` MiB on torch's threads."""
    from torch.utils.cpp_extension import load_inline

    ext = load_inline("radixlm_read_bandwidth", READ_KERNEL, functions=["read_all"],
                      extra_cflags=["-O3", "-fopenmp", "-march=native"], extra_ldflags=["-fopenmp"])
    buf = torch.ones(mb * 2**20 // 8, dtype=torch.int64)
    return buf.numel() * 8 / best_seconds(lambda: ext.read_all(buf), repeats)


def copy_bandwidth(mb: int, repeats: int) -> float:
    """bytes/s moved by dst.copy_(src) (each byte read once and written once)."""
    src = torch.ones(mb * 2**20 // 4, dtype=torch.float32)
    dst = torch.empty_like(src)
    return 2 * src.numel() * 4 / best_seconds(lambda: dst.copy_(src), repeats)


def best_seconds(run, repeats: int) -> float:
    """The fastest of ``repeats`` timed calls of ``run``, after one untimed warm-up call."""
    run()
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - t)
    return best


def weight_bytes(model: str | None) -> list[tuple[str, float]]:
    """Bytes a batch-1 decode step reads per weight format: (name, bytes)."""
    cfg = open_model(model).config
    from radixlm.runtime.model.llama import LlamaForCausalLM

    with torch.device("meta"):
        params = sum(p.numel() for p in LlamaForCausalLM(cfg).parameters())
    head = cfg.vocab_size * cfg.hidden_size  # the (tied) embedding / LM head
    return [("float32", params * 4), ("bfloat16", params * 2),
            ("Q8_0 / radixlm int8 (8.5 bits: codes, a float16 scale per 32)", params * 8.5 / 8),
            ("Q4_0 / int4 without minimums (4.5 bits)", params * 4.5 / 8),
            ("Q4_1 / radixlm int4 (5 bits: codes, scale, minimum)", params * 5 / 8),
            ("radixlm int4 layers + int8 LM head (the default for a Q4 file)",
             (params - head) * 5 / 8 + head * 8.5 / 8)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="GGUF file or HF folder (default: the embedded SmolLM2)")
    ap.add_argument("--mb", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    read, copy = read_bandwidth(args.mb, args.repeats), copy_bandwidth(args.mb, args.repeats)
    print(f"{time.strftime('%Y-%m-%d %H:%M')}, {cpu_description()}, {torch.get_num_threads()} threads")
    print(f"memory read bandwidth: {read / 1e9:.1f} GB/s (copy: {copy / 1e9:.1f} GB/s read + write)")
    print(f"\n{args.model or 'SmolLM2-135M-Instruct'}\n| weights | bytes per step | decode ceiling (tok/s, batch 1) |")
    print("|---|---|---|")
    for name, nbytes in weight_bytes(args.model):
        print(f"| {name} | {nbytes / 1e6:.0f} MB | {read / nbytes:.0f} |")


if __name__ == "__main__":
    main()
