"""TTFT against the length of a shared prefix, with the radix cache warm and cold, in one process.

    python benchmarks/bench_prefix_ttft.py [--lengths 256 512 1024 2048 4096] [--out benchmarks/results/prefix_ttft/FILE.json]

For each prefix length L: one request of L shared tokens + 32 new ones, timed to its first token (one new
token) after the prefix was cached by an earlier request ("cache on"), and after ``flush_cache`` ("cache
off", the same engine: the same kernels and threads). Best of ``--repeats``; the ratio is off / on.
"""

from __future__ import annotations

import argparse
import json
import time

from harness import cpu_description, text_of_tokens

from radixlm.runtime.engine import Engine

SUFFIX = 32


def ttft(engine: Engine, ids: list[int]) -> float:
    t = time.perf_counter()
    engine.generate(input_ids=[ids], sampling_params={"temperature": 0, "max_new_tokens": 1})
    return time.perf_counter() - t


def measure(engine: Engine, prefix: list[int], repeats: int, seed: int) -> dict:
    tok = engine.tokenizer
    cold, warm = [], []
    for r in range(repeats):
        engine.flush_cache()
        cold.append(ttft(engine, prefix + text_of_tokens(tok, SUFFIX, seed=seed + 2 * r)))
        warm.append(ttft(engine, prefix + text_of_tokens(tok, SUFFIX, seed=seed + 2 * r + 1)))
    return {"off": min(cold), "on": min(warm)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lengths", type=int, nargs="+", default=[256, 512, 1024, 2048, 4096])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=None, help="write the results as JSON (benchmarks/plot.py draws them)")
    args = ap.parse_args()
    engine = Engine()
    ttft(engine, text_of_tokens(engine.tokenizer, 64, seed=0))  # warm-up
    results = {}
    for i, n in enumerate(args.lengths):
        results[str(n)] = measure(engine, text_of_tokens(engine.tokenizer, n, seed=100 + i), args.repeats, 1000 * i)
    header = f"{time.strftime('%Y-%m-%d %H:%M')}, {cpu_description()}, SmolLM2-135M-Instruct, Engine() defaults"
    print(f"\n{header}\n| shared prefix (tokens) | TTFT cache off (ms) | TTFT cache on (ms) | off / on |")
    print("|---|---|---|---|")
    for n, r in results.items():
        print(f"| {n} + {SUFFIX} | {r['off'] * 1e3:.0f} | {r['on'] * 1e3:.0f} | {r['off'] / r['on']:.1f}x |")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"kind": "prefix_ttft", "header": header, "suffix": SUFFIX, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
