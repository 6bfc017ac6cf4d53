"""Generated shared prefix: what the radix cache and cache-aware scheduling are worth.

    python benchmarks/bench_prefix_cache.py [--groups 8 --per-group 16 --system-len 1000 --question-len 64]

All requests are submitted at once to one Engine. Compares radix cache + lpm, radix cache + fcfs and
--disable-radix-cache in the same run, then the radix overhead on a workload with no sharing.
"""

from __future__ import annotations

import argparse
import time

from harness import text_of_tokens

from radixlm.runtime.engine import Engine


def run(engine: Engine, prompts: list[list[int]], out_len: int) -> dict:
    engine.flush_cache()
    sp = {"temperature": 0, "max_new_tokens": out_len, "ignore_eos": True}
    t = time.perf_counter()
    res = engine.generate(input_ids=prompts, sampling_params=sp)
    wall = time.perf_counter() - t
    prompt_tokens = sum(r["meta_info"]["prompt_tokens"] for r in res)
    return {"wall": wall, "tok_s": len(prompts) * out_len / wall,
            "ttft": sum(r["meta_info"]["ttft"] for r in res) / len(res),
            "hit": sum(r["meta_info"]["cached_tokens"] for r in res) / prompt_tokens,
            "outputs": [r["output_ids"] for r in res]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--groups", type=int, default=8)
    ap.add_argument("--per-group", type=int, default=16)
    ap.add_argument("--system-len", type=int, default=1000)
    ap.add_argument("--question-len", type=int, default=64)
    ap.add_argument("--output-len", type=int, default=32)
    ap.add_argument("--dtype", default="bfloat16")
    args = ap.parse_args()
    base = Engine(dtype=args.dtype, max_running_requests=128)
    tok = base.tokenizer
    systems = [text_of_tokens(tok, args.system_len, seed=1000 + g) for g in range(args.groups)]
    prompts = [systems[g] + text_of_tokens(tok, args.question_len, seed=g * 1000 + i)
               for i in range(args.per_group) for g in range(args.groups)]  # groups interleaved on arrival
    n_prompt = sum(map(len, prompts))
    optimum = (len(prompts) - args.groups) * args.system_len / n_prompt
    engines = {
        "radix + lpm": base,
        "radix + fcfs": Engine.from_model(base.model, tok, schedule_policy="fcfs", max_running_requests=128),
        "no radix cache": Engine.from_model(base.model, tok, disable_radix_cache=True, max_running_requests=128),
    }
    base.generate(input_ids=prompts[:1], sampling_params={"max_new_tokens": 1})  # warm-up
    results = {name: run(e, prompts, args.output_len) for name, e in engines.items()}
    ref = results["no radix cache"]
    print(f"\n{args.groups} groups x {args.per_group} requests, {args.system_len}-token shared system prompt, "
          f"{args.question_len}-token questions, {args.output_len} out, {args.dtype}; "
          f"optimal hit rate {optimum:.1%}")
    print("| config | output tok/s | mean TTFT (s) | cache hit rate | throughput vs no cache | outputs equal to no-cache |")
    print("|---|---|---|---|---|---|")
    for name, r in results.items():
        same = sum(a == b for a, b in zip(r["outputs"], ref["outputs"], strict=True)) / len(prompts)
        print(f"| {name} | {r['tok_s']:.1f} | {r['ttft']:.2f} | {r['hit']:.1%} | {r['tok_s'] / ref['tok_s']:.2f}x "
              f"| {same:.0%} |")
    lpm, fcfs = results["radix + lpm"], results["radix + fcfs"]
    print(f"lpm vs fcfs: throughput {lpm['tok_s'] / fcfs['tok_s']:.2f}x, TTFT {fcfs['ttft'] / lpm['ttft']:.2f}x lower")
    distinct = [text_of_tokens(tok, 200, seed=50_000 + i) for i in range(64)]
    on = min((run(base, distinct, 64) for _ in range(2)), key=lambda r: r["wall"])
    off = min((run(engines["no radix cache"], distinct, 64) for _ in range(2)), key=lambda r: r["wall"])
    print(f"\nno sharing (64 distinct 200-token prompts, 64 out): radix {on['tok_s']:.1f} tok/s, "
          f"no radix {off['tok_s']:.1f} tok/s, overhead {(off['tok_s'] / on['tok_s'] - 1):+.1%}")


if __name__ == "__main__":
    main()
