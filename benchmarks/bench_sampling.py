"""What sampling costs: decode throughput with each sampling setting (filters, penalties) against greedy, in the
same process.

    python benchmarks/bench_sampling.py [--batch 1 8] [--tokens 128] [--rounds 2] [--out benchmarks/results/sampling/FILE.json]

The Engine's defaults on the embedded SmolLM2, ``ignore_eos``, a fixed prompt, one seed per request. Each
round runs greedy, then every setting, then greedy again; a setting's ratio is its tok/s over the mean of the
greedy runs around it, so the machine's drift between rounds cancels. A ratio near 1 means sampling adds
little to the step: the forward pass dominates.
"""

from __future__ import annotations

import argparse
import statistics
import time

from harness import cpu_description, decode_tok_s, save_result

SETTINGS = {
    "temperature 0.7": {"temperature": 0.7},
    "temperature 0.7, top_p 0.95": {"temperature": 0.7, "top_p": 0.95},
    "temperature 1, top_k 40": {"temperature": 1.0, "top_k": 40},
    "temperature 1, min_p 0.05": {"temperature": 1.0, "min_p": 0.05},
    "temperature 0.7, repetition_penalty 1.1": {"temperature": 0.7, "repetition_penalty": 1.1},
    "temperature 0.7, frequency / presence 0.5": {"temperature": 0.7, "frequency_penalty": 0.5,
                                                  "presence_penalty": 0.5},
}
PROMPT = "Write a long story about a dragon who learns to cook."


def tok_s(engine, sampling: dict, batch: int, tokens: int) -> float:
    params = [dict(sampling, max_new_tokens=tokens, seed=i) for i in range(batch)]
    return decode_tok_s(engine, [PROMPT] * batch, params)[0]


def measure(engine, batch: int, tokens: int, rounds: int) -> dict:
    ratios: dict[str, list[float]] = {name: [] for name in SETTINGS}
    greedy: list[float] = []
    for _ in range(rounds):
        before = tok_s(engine, {"temperature": 0}, batch, tokens)
        runs = {name: tok_s(engine, sp, batch, tokens) for name, sp in SETTINGS.items()}
        after = tok_s(engine, {"temperature": 0}, batch, tokens)
        greedy += [before, after]
        for name, value in runs.items():
            ratios[name].append(value / ((before + after) / 2))
    return {"batch": batch, "greedy_tok_s": statistics.mean(greedy),
            "ratio": {name: statistics.median(r) for name, r in ratios.items()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    from radixlm.runtime import Engine

    engine = Engine()
    tok_s(engine, {"temperature": 0.7, "top_p": 0.95}, 1, 8)  # warm-up
    results = [measure(engine, b, args.tokens, args.rounds) for b in args.batch]
    engine.shutdown()
    print(f"\n{time.strftime('%Y-%m-%d %H:%M')}, {cpu_description()}, SmolLM2-135M Engine defaults, "
          f"{args.tokens} tokens a request, median of {args.rounds} rounds")
    print("| batch | greedy tok/s | " + " | ".join(SETTINGS) + " |")
    print("|---|---|" + "---|" * len(SETTINGS))
    for r in results:
        print(f"| {r['batch']} | {r['greedy_tok_s']:.1f} | "
              + " | ".join(f"{r['ratio'][name]:.2f}x" for name in SETTINGS) + " |")
    save_result(args.out, results=results)


if __name__ == "__main__":
    main()
