"""Data and tensor parallelism on one machine, as ratios measured in the same run.

    python benchmarks/bench_parallel.py [--groups 8 --per-group 8 --system-len 1000 --kv-tokens 6000]

DP: two replicas (one thread each) behind the standalone router, cache_aware vs round_robin, on the
shared-prefix workload, its requests in random order. Each replica's KV pool holds about half of the groups'
system prompts, so where a group's requests land decides whether its prefix is still cached.
TP (--tp): the random workload on one server with --tp-size 1 and then 2 (gloo, one thread per rank).
"""

from __future__ import annotations

import argparse
import asyncio

import httpx
from harness import radixlm_command, start_server, stop_server
from loadgen import main_async


def start(*flags: str, command: str = "serve"):
    return start_server(radixlm_command(*flags, command=command), timeout=300)


def workload(args, url: str, dataset: str) -> dict:
    ns = argparse.Namespace(base_url=url, model="default", dataset=dataset, num_prompts=args.num_prompts,
                            input_len=200, output_len=args.output_len, groups=args.groups,
                            per_group=args.per_group, system_len=args.system_len, question_len=30,
                            conversations=0, turns=0, concurrency=8, request_rate=0.0, shuffle=True,
                            extra_body='{"ignore_eos": true}', timeout=1200, seed=0)
    return asyncio.run(main_async(ns))


def bench_dp(args) -> None:
    replicas = [start("--num-threads", "1", "--max-total-tokens", str(args.kv_tokens)) for _ in range(2)]
    rows = {}
    try:
        for policy in ("round_robin", "cache_aware"):
            for _, url in replicas:
                httpx.post(f"{url}/flush_cache", timeout=30)
            router, url = start("--worker-urls", *(u for _, u in replicas), "--router-policy", policy,
                                command="router")
            try:
                rows[policy] = workload(args, url, "shared-prefix")
            finally:
                stop_server(router)
    finally:
        for p, _ in replicas:
            stop_server(p)
    print(f"\nDP=2, {args.groups} groups x {args.per_group} requests, {args.system_len}-token system prompts, "
          f"{args.output_len} out, concurrency 8, {args.kv_tokens} KV tokens per replica")
    table(rows, "round_robin")


def bench_tp(args) -> None:
    rows = {}
    for tp in (1, 2):
        proc, url = start("--tp-size", str(tp))
        try:
            workload(args, url, "random")  # warm-up
            httpx.post(f"{url}/flush_cache", timeout=30)
            rows[f"tp={tp}"] = workload(args, url, "random")
        finally:
            stop_server(proc)
    print(f"\nTP on this CPU: random {args.num_prompts} x 200 in / {args.output_len} out, concurrency 8")
    table(rows, "tp=1")


def table(rows: dict, base: str) -> None:
    print("| config | output tok/s | mean TTFT (ms) | mean TPOT (ms) | cache hit rate | vs " + base + " |")
    print("|---|---|---|---|---|---|")
    for name, s in rows.items():
        ratio = s["output_throughput"] / rows[base]["output_throughput"]
        print(f"| {name} | {s['output_throughput']:.1f} | {s['mean_ttft_ms']:.0f} | {s['mean_tpot_ms']:.1f} | "
              f"{100 * s['cache_hit_rate']:.1f}% | {ratio:.2f}x (errors: {s['errors']}) |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--groups", type=int, default=8)
    ap.add_argument("--per-group", type=int, default=8)
    ap.add_argument("--system-len", type=int, default=1000)
    ap.add_argument("--output-len", type=int, default=16)
    ap.add_argument("--num-prompts", type=int, default=16)
    ap.add_argument("--kv-tokens", type=int, default=6000)
    ap.add_argument("--tp", action="store_true", help="also compare --tp-size 1 and 2")
    args = ap.parse_args()
    bench_dp(args)
    if args.tp:
        bench_tp(args)


if __name__ == "__main__":
    main()
