"""Every weight form's matmul kernel alone, on each kernel path this CPU has, as a ratio to the int4 K-quant form
(GGUF's Q4_K) in the same run: which forms are bound by memory and which by arithmetic, and where a path falls behind.

    python -P benchmarks/bench_weight_forms.py [--shape 8192 2048] [--rows 1 8] [--paths avx2 avx512]
                                               [--rounds 9] [--out benchmarks/results/weight_forms/FILE.json]

One [N, K] weight per form (random codes and scales in the file's ranges), x [rows, K] float32; a round times 30
calls after 3 warm-up calls, and a form's result is its fastest round (the least disturbed by the machine's
neighbours). The default 8192 x 2048 weight (8.6 to 17 MB) sits in a large L3, so the arithmetic shows; pass a
larger shape to measure from memory.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
from harness import cpu_description, save_result

from radixlm.kernels import cpu_ext
from radixlm.kernels import cpu_matmul as cm

# form -> bits a weight (codes and scales) in its kernel's layout
BITS = {"int8 (Q8_0)": 8.5, "int4 K (Q4_K)": 4.625, "int4 (Q4_0)": 4.5, "IQ4_XS": 4.3125, "int5 K (Q5_K)": 5.625,
        "int6 (Q6_K)": 6.5625, "int3 (Q3_K)": 3.5625, "int2 (Q2_K)": 3.125, "table (IQ2_XS)": 4.5625,
        "grid (IQ2_XXS)": 4.3125}


def make_forms(n: int, k: int, isa: int) -> dict:
    """form -> a function of x running that form's kernel on path ``isa``."""
    g = torch.Generator().manual_seed(0)

    def ints(lo: int, hi: int, *shape: int) -> torch.Tensor:
        return torch.randint(lo, hi, shape, generator=g)

    d32, d256 = torch.rand(n, k // 32, generator=g) * 1e-3, torch.rand(n, k // 256, generator=g) * 1e-3
    w8 = cm.pack_int8(ints(-127, 128, n, k).to(torch.int8), d32)
    w4 = cm.pack_int4(ints(0, 16, n, k), d32, None)
    w4k = cm.pack_kquant(ints(0, 16, n, k), ints(0, 64, n, k // 32), ints(0, 64, n, k // 32), d256, d256, 4)
    w5k = cm.pack_kquant(ints(0, 32, n, k), ints(0, 64, n, k // 32), ints(0, 64, n, k // 32), d256, d256, 5)
    wxs = cm.pack_iq4(ints(0, 16, n, k), d256, ints(-32, 32, n, k // 32))
    w6 = cm.pack_int6(ints(0, 64, n, k), ints(-128, 128, n, k // 16), d256)
    w3 = cm.pack_int3(ints(0, 8, n, k), ints(-32, 32, n, k // 16), d256)
    w2 = cm.pack_int2(ints(0, 4, n, k), ints(0, 16, n, k // 16), ints(0, 16, n, k // 16), d256, d256)
    wt = cm.pack_table(ints(0, 6, n, k), 1 + 2 * ints(0, 16, n, k // 16), d256)
    wg = cm.pack_iq4(ints(0, 6, n, k), d256, 1 + 2 * ints(0, 16, n, k // 32))
    return {"int8 (Q8_0)": lambda x: cm.int8_linear(x, *w8, isa),
            "int4 K (Q4_K)": lambda x: cm.int4_linear(x, *w4k, isa),
            "int4 (Q4_0)": lambda x: cm.int4_linear(x, *w4, isa),
            "IQ4_XS": lambda x: cm.int4_linear(x, *wxs, None, isa),
            "int5 K (Q5_K)": lambda x: cm.int5_linear(x, *w5k, isa),
            "int6 (Q6_K)": lambda x: cm.int6_linear(x, *w6, isa),
            "int3 (Q3_K)": lambda x: cm.int3_linear(x, *w3, isa),
            "int2 (Q2_K)": lambda x: cm.int2_linear(x, *w2, isa),
            "table (IQ2_XS)": lambda x: cm.int4_linear(x, *wt, cm.GRID_VALUES, isa),
            "grid (IQ2_XXS)": lambda x: cm.int4_linear(x, *wg, cm.GRID_VALUES, isa)}


def time_forms(forms: dict, x: torch.Tensor, rounds: int) -> dict[str, float]:
    """form -> its fastest round's microseconds a call; the forms alternate within each round."""
    best = {name: float("inf") for name in forms}
    for _ in range(rounds):
        for name, f in forms.items():
            for _ in range(3):
                f(x)
            t = time.perf_counter()
            for _ in range(30):
                f(x)
            best[name] = min(best[name], (time.perf_counter() - t) / 30 * 1e6)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", type=int, nargs=2, default=[8192, 2048], metavar=("N", "K"))
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--paths", nargs="+", default=None, choices=cpu_ext.PATHS,
                    help="default: every path this CPU has but portable and avx512_bf16")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if not cpu_ext.available():
        sys.exit("radixlm's CPU kernels did not build on this machine")
    n, k = args.shape
    # by default the fast paths: the portable one is a reference, and avx512_bf16 only changes the activations
    paths = args.paths or [p for p in cpu_ext.supported() if p not in ("portable", "avx512_bf16")]
    stamp = time.strftime("%Y-%m-%d %H:%M")
    print(f"{stamp}, {cpu_description()}, weight {n} x {k}, {torch.get_num_threads()} threads\n")
    results = []
    for path in paths:
        forms = make_forms(n, k, cpu_ext.resolve(path))
        for m in args.rows:
            x = torch.randn(m, k, generator=torch.Generator().manual_seed(1))
            us = time_forms(forms, x, args.rounds)
            base = us["int4 K (Q4_K)"]
            for name, t in us.items():
                gbs = n * k * BITS[name] / 8 / (t * 1e-6) / 1e9
                results.append({"path": path, "rows": m, "form": name, "us": round(t, 1),
                                "vs_int4_k": round(t / base, 3), "bits": BITS[name], "GB_s": round(gbs, 1)})
                print(f"{path:>10} {m:>3} rows  {name:<14} {t:8.1f} us  {t / base:5.2f}x int4 K  {gbs:6.1f} GB/s")
            print()
    save_result(args.out, date=stamp, shape=[n, k], threads=torch.get_num_threads(), results=results)


if __name__ == "__main__":
    main()
