"""Weights and kernels on the CPU, all in one run: the 30 layers' matmuls per token on torch's kernels and on each
path of radixlm's (portable, avx2, avx512... whatever this CPU has), the 49k-row int8 LM head, and decode speed
of the whole engine per configuration, as ratios against dense bfloat16 on torch's ops in the same run.

    python benchmarks/bench_quant.py [--new-tokens 64] [--repeats 3] [--batch 1 8] [--rows 1 8 64 800]
                                     [--engine-paths avx2 avx2_vnni] [--out benchmarks/results/quant/FILE.json]

Kernels: SmolLM2's four linear shapes x 30 distinct layers (so weights stream from memory, as in a real
step), median of 15 passes. Engine: greedy, ``ignore_eos``, a ~64-token prompt per request, best of
``--repeats`` runs (the prompt is cached after the first, so this is decode speed), each configuration in a
process of its own. "default" is plain ``Engine()``: the file's int4 layers on the fused decoder layers.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import multiprocessing
import time

import torch
from harness import cpu_description, decode_tok_s, save_result

from radixlm.kernels import cpu_ext
from radixlm.runtime.engine import Engine
from radixlm.runtime.model.quantization import QuantWeight

SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)]  # qkv, o, gate_up, down (N, K)
ENGINES = {  # name -> Engine options
    "float32, torch's ops": {"dtype": "float32", "quantization": "none", "cpu_kernels": "torch",
                             "deterministic": False},
    "bfloat16, torch's ops": {"quantization": "none", "cpu_kernels": "torch", "deterministic": False},
    "int4, torch's kernels": {"quantization": "int4", "cpu_kernels": "torch", "deterministic": False},
    "int4, torch's kernels, compiled": {"quantization": "int4", "cpu_kernels": "torch", "enable_torch_compile": True,
                                        "deterministic": False},
    "int4, radixlm's kernels, compiled": {"quantization": "int4", "enable_torch_compile": True,
                                          "deterministic": False},
    "int8, radixlm's fused layers": {"quantization": "int8"},
    "default (int4, radixlm's fused layers)": {},
}


def median_ms(step, n: int = 15) -> float:
    step()
    times = []
    for _ in range(n):
        t = time.perf_counter()
        step()
        times.append(time.perf_counter() - t)
    return sorted(times)[n // 2] * 1e3


def layer_matmuls_ms(kind: str, rows: int, path: str) -> float:
    """30 layers' four matmuls; kind bf16 (torch's dense matmul), int8 or int4 on path (torch or radixlm's)."""
    gen = torch.Generator().manual_seed(0)
    isa = None if path == "torch" else cpu_ext.PATHS.index(path)
    weights = []
    for _ in range(30):
        for n, k in SHAPES:
            w = torch.randn(n, k, generator=gen, dtype=torch.float32).to(torch.bfloat16)
            weights.append((w, k) if kind == "bf16" else (QuantWeight.quantize(w, kind, torch.bfloat16, isa), k))
    xs = {k: torch.randn(rows, k, dtype=torch.bfloat16) for _, k in SHAPES}

    def step() -> None:
        for w, k in weights:
            torch.nn.functional.linear(xs[k], w) if kind == "bf16" else w.matmul(xs[k])

    return median_ms(step)


def lm_head_ms(rows: int, path: str) -> float:
    """The int8 49,152 x 576 head (SmolLM2's tied embedding)."""
    w = torch.randn(49152, 576, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    q = QuantWeight.quantize(w, "int8", torch.bfloat16, None if path == "torch" else cpu_ext.PATHS.index(path))
    x = torch.randn(rows, 576, dtype=torch.bfloat16)
    return median_ms(lambda: q.matmul(x))


def engine_tok_s(options: dict, batches: list[int], new_tokens: int, repeats: int) -> dict:
    """Decode tok/s at each batch size, and the startup time."""
    t = time.perf_counter()
    engine = Engine(progress=False, **options)
    out = {"startup_s": time.perf_counter() - t}
    for batch in batches:
        prompts = [f"Question {i}: write a long story about a dragon number {i} and a knight. " * 4
                   for i in range(batch)]
        sp = {"max_new_tokens": new_tokens, "temperature": 0}
        out[str(batch)] = max(decode_tok_s(engine, prompts, sp)[0] for _ in range(repeats))
    return out


def in_child(fn, *args):
    """fn(*args) in a fresh process: engines left in one process (their graphs, pools and threads) slowed the
    later ones."""
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=ctx) as pool:
        return pool.submit(fn, *args).result()


def kernel_tables(rows: list[int]) -> dict:
    paths = ["torch", *cpu_ext.supported()]
    table = {}
    print("| 30 layers' matmuls (ms) | " + " | ".join(f"{r} row(s)" for r in rows) + " |")
    print("|---|" + "---|" * len(rows))
    for kind, path in [("bf16", "torch")] + [(k, p) for k in ("int8", "int4") for p in paths]:
        name = "bf16 dense (torch)" if kind == "bf16" else f"{kind} ({path})"
        table[name] = [layer_matmuls_ms(kind, r, path) for r in rows]
        print(f"| {name} | " + " | ".join(f"{v:.1f}" for v in table[name]) + " |")
    for path in paths:
        name = f"int8 LM head ({path})"
        table[name] = [lm_head_ms(r, path) for r in rows]
        print(f"| {name} | " + " | ".join(f"{v:.2f}" for v in table[name]) + " |")
    return table


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 8, 64, 800])
    ap.add_argument("--engines", nargs="+", default=list(ENGINES), choices=list(ENGINES))
    ap.add_argument("--engine-paths", nargs="*", default=[], choices=cpu_ext.PATHS,
                    help="also run the default engine forced onto each of these radixlm kernel paths, in turn")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    print(f"{time.strftime('%Y-%m-%d %H:%M')}, {cpu_description()}, radixlm kernel paths: {cpu_ext.supported()}\n")
    kernels = kernel_tables(args.rows)
    engines = {name: in_child(engine_tok_s, ENGINES[name], args.batch, args.new_tokens, args.repeats)
               for name in args.engines}
    for path in args.engine_paths:
        engines[f"default on the {path} path"] = in_child(engine_tok_s, {"cpu_kernels": path}, args.batch,
                                                          args.new_tokens, args.repeats)
    base = engines.get("bfloat16, torch's ops")
    print("\n| engine | startup (s) | " + " | ".join(f"batch {b} tok/s" for b in args.batch) + " |")
    print("|---|---|" + "---|" * len(args.batch))
    for name, res in engines.items():
        cells = [f"{res[str(b)]:.1f}" + (f" ({res[str(b)] / base[str(b)]:.2f}x)" if base else "") for b in args.batch]
        print(f"| {name} | {res['startup_s']:.1f} | " + " | ".join(cells) + " |")
    save_result(args.out, rows=args.rows, kernels_ms=kernels, engines_tok_s=engines)


if __name__ == "__main__":
    main()
