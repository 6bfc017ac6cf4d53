"""Weight-only quantization on the CPU, all in one run: the 30 layers' matmuls per token (kernels alone: torch's
and radixlm's AVX512-VNNI ones), the 49k-row int8 LM head, and decode speed of the whole engine per weight
format, eager and with the compiled decode step (``--enable-torch-compile``), with torch's ops
(``--cpu-kernels torch``) and radixlm's C++ kernels (auto), as ratios against eager bfloat16.

    python benchmarks/bench_quant.py [--new-tokens 64] [--repeats 4] [--batch 1 8] [--rows 1 8 16 64 800]

Kernels: SmolLM2's four linear shapes x 30 distinct layers (so weights stream from memory, as in a real
step), median of 15 passes. Engine: greedy, ``ignore_eos``, a ~64-token prompt per request, best of
``--repeats`` runs (the prompt is cached after the first, so this is decode speed).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import multiprocessing
import time

import torch

from radixlm.runtime.engine import Engine
from radixlm.runtime.model.quantization import QuantWeight

SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)]  # qkv, o, gate_up, down (N, K)


def layer_matmuls_ms(kind: str, rows: int, kernels: str = "torch", layers: int = 30) -> float:
    gen = torch.Generator().manual_seed(0)
    weights = []
    for _ in range(layers):
        for n, k in SHAPES:
            w = torch.randn(n, k, generator=gen, dtype=torch.float32).to(torch.bfloat16)
            weights.append(w if kind == "bf16" else QuantWeight.quantize(w, kind, torch.bfloat16, kernels))
    xs = {k: torch.randn(rows, k, dtype=torch.bfloat16) for _, k in SHAPES}

    def step() -> float:
        t = time.perf_counter()
        for w in weights:
            x = xs[w.shape[1] if kind == "bf16" else _in_features(w)]
            torch.nn.functional.linear(x, w) if kind == "bf16" else w.matmul(x)
        return time.perf_counter() - t

    step()
    return sorted(step() for _ in range(15))[7] * 1e3


def _in_features(w: QuantWeight) -> int:
    return w.in_features


def lm_head_ms(rows: int, kernels: str) -> float:
    """The int8 49,152 x 576 head (SmolLM2's tied embedding), median of 15 calls."""
    w = torch.randn(49152, 576, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    q, x = QuantWeight.quantize(w, "int8", torch.bfloat16, kernels), torch.randn(rows, 576, dtype=torch.bfloat16)
    times = []
    for _ in range(16):
        t = time.perf_counter()
        q.matmul(x)
        times.append(time.perf_counter() - t)
    return sorted(times[1:])[7] * 1e3


def engine_tok_s(dtype: str, quantization: str, compiled: bool, kernels: str, batches: list[int], new_tokens: int,
                 repeats: int) -> list[float]:
    """Decode tok/s of one engine at each batch size."""
    engine = Engine(progress=False, dtype=dtype, quantization=quantization, enable_torch_compile=compiled,
                    cpu_kernels=kernels)
    speeds = []
    for batch in batches:
        prompts = [f"Question {i}: write a long story about a dragon number {i} and a knight. " * 4
                   for i in range(batch)]
        sp = {"max_new_tokens": new_tokens, "temperature": 0, "ignore_eos": True}
        engine.generate(prompts, {**sp, "max_new_tokens": 4})
        best = float("inf")
        for _ in range(repeats):
            t = time.perf_counter()
            engine.generate(prompts, sp)
            best = min(best, time.perf_counter() - t)
        speeds.append(batch * new_tokens / best)
    return speeds


def in_child(fn, *args):
    """fn(*args) in a fresh process: engines left in one process (their compiled graphs, pools and torch
    threads) slowed the later ones (the compiled int4 row with radixlm's kernels, ninth engine of the
    process: 55 tok/s at batch 1; alone in a process: 123-130, 2026-11-30)."""
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=ctx) as pool:
        return pool.submit(fn, *args).result()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=4)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 8, 16, 64, 800], help="kernel table: rows of x "
                    "(decode batches, and 800: a prefill of several prompts)")
    args = ap.parse_args()
    rows = args.rows
    print("| 30 layers' matmuls | " + " | ".join(f"{r} row(s) ms" for r in rows) + " |")
    print("|---|" + "---|" * len(rows))
    for kind, kernels in (("bf16", "torch"), ("int8", "torch"), ("int8", "auto"), ("int4", "torch"), ("int4", "auto")):
        name = kind + ("" if kind == "bf16" else " (torch)" if kernels == "torch" else " (radixlm VNNI)")
        print(f"| {name} | " + " | ".join(f"{layer_matmuls_ms(kind, r, kernels):.1f}" for r in rows) + " |")
    for kernels in ("torch", "auto"):
        name = "int8 LM head" + (" (torch)" if kernels == "torch" else " (radixlm VNNI)")
        print(f"| {name} | " + " | ".join(f"{lm_head_ms(r, kernels):.1f}" for r in rows) + " |")
    configs = [("float32", "none", False, "torch"), ("bfloat16", "none", False, "torch"),
               ("bfloat16", "int8", False, "torch"), ("bfloat16", "int4", False, "torch"),
               ("bfloat16", "none", True, "torch"), ("bfloat16", "int4", True, "torch"),
               ("bfloat16", "int8", False, "auto"), ("bfloat16", "int4", False, "auto"),
               ("bfloat16", "int4", True, "auto")]
    print("\n| weights | " + " | ".join(f"batch {b} tok/s | vs bf16" for b in args.batch) + " |")
    print("|---|" + "---|---|" * len(args.batch))
    results = {c: in_child(engine_tok_s, *c, args.batch, args.new_tokens, args.repeats) for c in configs}
    base = results[("bfloat16", "none", False, "torch")]
    for (dtype, quant, compiled, kernels), speeds in results.items():
        cells = " | ".join(f"{s:.1f} | {s / b:.2f}x" for s, b in zip(speeds, base, strict=True))
        name = dtype + ("" if quant == "none" else " + " + quant) + (", compiled" if compiled else "")
        name += ", radixlm kernels" if kernels == "auto" else ""
        print(f"| {name} | {cells} |")


if __name__ == "__main__":
    main()
