"""The dashboard's tree API stays bounded however big the tree gets: size and time per call.

    python benchmarks/bench_dashboard.py                      # in process: the scheduler's side of a call
    python benchmarks/bench_dashboard.py --url http://127.0.0.1:30000 --prompts 10000   # a live server

In process, trees of 100 / 1,000 / 10,000 distinct prompts (200 tokens each, every 10 sharing a 100-token
system prompt) are built in a RadixCache, and the scheduler's answer to one dashboard poll (top 60 nodes,
depth 8, previews on, plus namespace sizes) is built and encoded as it is sent. With ``--url``, the prompts go
to the server (one output token each) and /cache/tree and /requests are timed over HTTP, as the page polls.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time

import httpx
from harness import cpu_description

from radixlm.radix_cache import RadixCache
from radixlm.radix_cache.snapshot import tree_view
from radixlm.runtime.messages import CacheViewResp, encode

TOP, DEPTH, PREVIEW = 60, 8, 8


def prompts(n: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    systems = [[rng.randrange(49152) for _ in range(100)] for _ in range(max(n // 10, 1))]
    return [systems[i // 10] + [rng.randrange(49152) for _ in range(100)] for i in range(n)]


def in_process(sizes: list[int], calls: int) -> list[dict]:
    rows = []
    for n in sizes:
        tree, slot = RadixCache(), 0
        for p in prompts(n):
            tree.insert(p, list(range(slot, slot + len(p))))
            slot += len(p)
        times, size = [], 0
        for _ in range(calls):
            t = time.perf_counter()
            nodes, namespaces = tree_view(tree, TOP, DEPTH, None, PREVIEW)
            raw = encode(CacheViewResp(0, nodes=nodes, namespaces=namespaces))
            times.append(time.perf_counter() - t)
            size = len(raw)
        nodes = sum(1 for _ in tree.walk()) - 1
        rows.append({"prompts": n, "nodes": nodes, "bytes": size, "ms_median": sorted(times)[len(times) // 2] * 1e3,
                     "ms_max": max(times) * 1e3})
    return rows


async def over_http(url: str, n: int, calls: int) -> dict:
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        sem = asyncio.Semaphore(64)

        async def one(p: list[int]) -> None:
            async with sem:
                r = await client.post("/generate", json={"input_ids": p, "sampling_params": {"max_new_tokens": 1}})
                r.raise_for_status()

        t = time.perf_counter()
        await asyncio.gather(*(one([x % 40000 + 100 for x in p]) for p in prompts(n, seed=1)))
        load_s = time.perf_counter() - t
        out = {"prompts": n, "load_s": load_s}
        for path in (f"/cache/tree?top={TOP}&depth={DEPTH}", "/requests", "/cache/stats"):
            times, size = [], 0
            for _ in range(calls):
                t = time.perf_counter()
                r = await client.get(path)
                times.append(time.perf_counter() - t)
                r.raise_for_status()
                size = len(r.content)
            out[path.split("?")[0]] = {"bytes": size, "ms_median": sorted(times)[len(times) // 2] * 1e3,
                                       "ms_max": max(times) * 1e3}
        return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=int, nargs="+", default=[100, 1000, 10000])
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--url", default=None, help="a running radixlm server: load it and time its routes")
    ap.add_argument("--prompts", type=int, default=10000, help="with --url: distinct prompts sent first")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    header = f"{time.strftime('%Y-%m-%d %H:%M')}, {cpu_description()}"
    result: dict = {"kind": "dashboard", "header": header, "top": TOP, "depth": DEPTH}
    print(header)
    if args.url:
        result["http"] = r = asyncio.run(over_http(args.url, args.prompts, args.calls))
        print(f"{r['prompts']} prompts sent in {r['load_s']:.0f} s; then, per call:")
        print("| route | response bytes | median ms | max ms |\n|---|---|---|---|")
        for path in ("/cache/tree", "/requests", "/cache/stats"):
            print(f"| {path} | {r[path]['bytes']} | {r[path]['ms_median']:.1f} | {r[path]['ms_max']:.1f} |")
    else:
        result["in_process"] = rows = in_process(args.sizes, args.calls)
        print(f"The scheduler's answer to one poll (top {TOP}, depth {DEPTH}):")
        print("| distinct prompts | tree nodes | answer bytes | median ms | max ms |\n|---|---|---|---|---|")
        for r in rows:
            print(f"| {r['prompts']} | {r['nodes']} | {r['bytes']} | {r['ms_median']:.1f} | {r['ms_max']:.1f} |")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
