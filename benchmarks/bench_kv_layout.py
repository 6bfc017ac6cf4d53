"""Decode attention against where a request's KV slots lie in the pool: in one run, in runs of a page, or one
token here and one there (a free list after churn, or decode steps of many requests interleaved).

    python benchmarks/bench_kv_layout.py [--batch 1 8] [--context 1024 4096] [--runs 1 4 16] [--out FILE.json]

radixlm's C++ decode attention op alone (kernels/cpu_decode_attention.cpp, the path the CPU supports best),
SmolLM2's shape (9 query heads on 3 KV heads, head dim 64), bfloat16 pools of 65,536 slots, one per layer for
30 layers so that every call reads its KV from memory, as the engine's does after a step's weights have
streamed. Each layout's time is the best of 3 passes over the layers; its ratio is against the contiguous
layout's in the same run. ``--runs N``: the slots in runs of N consecutive ones, the runs scattered.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
from harness import cpu_description, save_result

SLOTS, LAYERS, HQ, HKV, D = 65536, 30, 9, 3, 64


def slots_in_runs(batch: int, context: int, run: int, seed: int) -> torch.Tensor:
    """int64 [batch, context]: each request's slots in runs of ``run`` consecutive ones at random places (no
    slot twice); run 0: each request's slots one block, the requests one after another."""
    if run == 0:
        return torch.arange(batch * context).view(batch, context) % SLOTS
    g = torch.Generator().manual_seed(seed)
    runs = -(-context // run)
    starts = torch.randperm(SLOTS // run, generator=g)[:batch * runs].view(batch, runs, 1) * run
    return (starts + torch.arange(run)).view(batch, -1)[:, :context].contiguous()


def time_layout(pools: list, idx: torch.Tensor, isa: int, passes: int = 3) -> float:
    """Seconds a layer: the best of ``passes`` passes of one decode attention call per layer."""
    from radixlm.kernels.cpu_decode_attention import decode_attention

    batch, context = idx.shape
    q = torch.randn(batch, HQ, D).bfloat16()
    counts = torch.full((batch,), context, dtype=torch.int64)
    prefix, member = torch.empty(0, dtype=torch.int64), torch.zeros(batch, dtype=torch.bool)
    best = float("inf")
    for _ in range(passes):
        t = time.perf_counter()
        for k, v in pools:
            decode_attention(q, k, v, idx, counts, prefix, member, isa)
        best = min(best, (time.perf_counter() - t) / len(pools))
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--context", type=int, nargs="+", default=[1024, 4096])
    ap.add_argument("--runs", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--out")
    args = ap.parse_args()
    from radixlm.kernels import cpu_ext

    if not cpu_ext.available():
        sys.exit("radixlm's CPU kernels did not build")
    path = cpu_ext.supported()[-1]
    isa = cpu_ext.PATHS.index(path)
    pools = [(torch.randn(HKV, SLOTS, D).bfloat16(), torch.randn(HKV, SLOTS, D).bfloat16()) for _ in range(LAYERS)]
    print(f"{time.strftime('%Y-%m-%d %H:%M')}, {cpu_description()}, kernel path {path}")
    print("| batch | context | contiguous µs a layer | " + " | ".join(f"runs of {r}" for r in args.runs) + " |")
    print("|---|---|---|" + "---|" * len(args.runs))
    results = []
    for batch in args.batch:
        for context in args.context:
            base = time_layout(pools, slots_in_runs(batch, context, 0, 0), isa)
            row = {"batch": batch, "context": context, "contiguous_us": base * 1e6, "runs": {}}
            for run in args.runs:
                row["runs"][run] = time_layout(pools, slots_in_runs(batch, context, run, run), isa) * 1e6
            results.append(row)
            cells = " | ".join(f"{us:.0f} ({us / row['contiguous_us']:.2f}x)" for us in row["runs"].values())
            print(f"| {batch} | {context} | {row['contiguous_us']:.0f} | {cells} |", flush=True)
    save_result(args.out, kernel_path=path, results=results)


if __name__ == "__main__":
    main()
