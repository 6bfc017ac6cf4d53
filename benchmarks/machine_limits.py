"""The physical limits of this machine for single-stream decode: memory bandwidth (measured), weight bytes
read per decode step, and the decode-rate ceiling that follows.

    python benchmarks/machine_limits.py [--mb 1024 --repeats 5]

Bandwidth: a large tensor copy (read + write), best of several runs, with torch's threads (all cores).
A decode step at batch 1 reads every weight once (the LM head included; the tied embedding's lookup reads
one row), so ceiling tok/s = bandwidth / weight bytes, per weight dtype.
"""

from __future__ import annotations

import argparse
import time

import torch

from radixlm.runtime.model.loader import open_model


def copy_bandwidth(mb: int, repeats: int) -> float:
    """bytes/s moved by dst.copy_(src) (each byte read once and written once)."""
    src = torch.ones(mb * 2**20 // 4, dtype=torch.float32)
    dst = torch.empty_like(src)
    dst.copy_(src)  # touch the pages first
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - t)
    return 2 * src.numel() * 4 / best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    bw = copy_bandwidth(args.mb, args.repeats)
    cfg = open_model(None).config
    from radixlm.runtime.model.llama import LlamaForCausalLM

    with torch.device("meta"):
        params = sum(p.numel() for p in LlamaForCausalLM(cfg).parameters())
    print(f"\nmemory bandwidth (copy of {args.mb} MiB, {torch.get_num_threads()} threads): {bw / 1e9:.1f} GB/s")
    print(f"SmolLM2-135M: {params / 1e6:.1f} M parameters read per decode step")
    print("| weights | bytes per step | decode ceiling (tok/s, batch 1) |")
    print("|---|---|---|")
    head = cfg.vocab_size * cfg.hidden_size  # the tied embedding / LM head
    rows = (("float32", params * 4), ("bfloat16", params * 2), ("int8", params * 1),
            ("int4 everywhere (Q4_1: 5 bits with scales)", params * 5 / 8),
            ("radixlm --quantization int4 (int4 layers, int8 LM head)", (params - head) * 5 / 8 + head))
    for name, nbytes in rows:
        print(f"| {name} | {nbytes / 1e6:.0f} MB | {bw / nbytes:.0f} |")


if __name__ == "__main__":
    main()
