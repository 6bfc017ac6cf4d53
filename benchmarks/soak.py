"""Soak: mixed traffic against a running server for a fixed time; reports what held and what did not.

    radixlm serve --port 30000 &
    python benchmarks/soak.py --base-url http://127.0.0.1:30000 --minutes 10 --concurrency 8

Mix: chat (some streaming), text completions, JSON-schema requests, clients that disconnect mid-stream,
and a few bad requests. Every minute it records the scheduler's resident memory and KV state. Talks only to
the given base URL (use 127.0.0.1) and stops by itself.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import random
import time

import httpx
from harness import cpu_description

SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0,
                                                                            "maximum": 99}}, "required": ["ok", "n"]}


async def one(client: httpx.AsyncClient, base: str, rng: random.Random) -> tuple[str, float]:
    kind = rng.choices(["chat", "stream", "completion", "json", "disconnect", "bad"], [3, 3, 2, 1, 1, 0.3])[0]
    msg = [{"role": "user", "content": " ".join(rng.choice(["tell", "me", "about", "rivers", "stars", "code"])
                                                for _ in range(rng.randint(3, 60)))}]
    body = {"messages": msg, "max_tokens": rng.randint(4, 48), "temperature": 0.7}
    start = time.perf_counter()
    try:
        if kind in ("stream", "disconnect"):
            async with client.stream("POST", f"{base}/v1/chat/completions", json={**body, "stream": True}) as r:
                n = 0
                async for line in r.aiter_lines():
                    n += line.startswith("data: {")
                    if kind == "disconnect" and n >= 3:
                        break
                status = r.status_code
        elif kind == "completion":
            status = (await client.post(f"{base}/v1/completions", json={"prompt": msg[0]["content"],
                                                                        "max_tokens": body["max_tokens"]})).status_code
        elif kind == "json":
            rf = {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA}}
            r = await client.post(f"{base}/v1/chat/completions", json={**body, "max_tokens": 60, "response_format": rf})
            status = r.status_code
            if status == 200:
                json.loads(r.json()["choices"][0]["message"]["content"])
        elif kind == "bad":
            status = (await client.post(f"{base}/v1/chat/completions", json={**body, "temperature": -1})).status_code
            return ("ok" if status == 400 else f"bad request got {status}"), time.perf_counter() - start
        else:
            status = (await client.post(f"{base}/v1/chat/completions", json=body)).status_code
    except (httpx.HTTPError, json.JSONDecodeError, KeyError) as e:
        return f"{kind}: {type(e).__name__}", time.perf_counter() - start
    return ("ok" if status == 200 else f"{kind}: HTTP {status}"), time.perf_counter() - start


async def main_async(args) -> None:
    rng = random.Random(args.seed)
    outcomes: collections.Counter = collections.Counter()
    latencies: list[float] = []
    memory: list[tuple[float, float, int]] = []
    end = time.monotonic() + args.minutes * 60
    async with httpx.AsyncClient(timeout=300) as client:
        async def worker():
            while time.monotonic() < end:
                outcome, lat = await one(client, args.base_url, rng)
                outcomes[outcome] += 1
                latencies.append(lat)

        async def sampler():
            t0 = time.monotonic()
            while time.monotonic() < end:
                info = (await client.get(f"{args.base_url}/server_info")).json()
                stats = info["stats"] or {}
                memory.append((time.monotonic() - t0, stats.get("rss_mb", 0.0), stats.get("kv_used", 0),
                               process_rss_mb(info.get("api_pid"))))
                await asyncio.sleep(args.sample_s)

        await asyncio.gather(sampler(), *(worker() for _ in range(args.concurrency)))
        await asyncio.sleep(2)
        final = (await client.get(f"{args.base_url}/server_info")).json()["stats"]
    lat = sorted(latencies)
    print(f"requests: {sum(outcomes.values())}, ok: {outcomes['ok']}, errors: "
          f"{ {k: v for k, v in outcomes.items() if k != 'ok'} }")
    print(f"latency p50 {lat[len(lat) // 2]:.2f} s, p99 {lat[int(len(lat) * 0.99)]:.2f} s")
    print("| minute | scheduler RSS (MB) | API RSS (MB) | KV tokens in use |\n|---|---|---|---|")
    for t, rss, kv, api in memory:
        print(f"| {t / 60:.1f} | {rss:.0f} | {api:.0f} | {kv} |")
    late = [m for m in memory if m[0] >= args.warmup_minutes * 60]
    trend = {"scheduler": slope([(t / 60, r) for t, r, _, _ in late]), "api": slope([(t / 60, a) for t, _, _, a in late])}
    print(f"RSS trend after minute {args.warmup_minutes:g}: scheduler {trend['scheduler']:+.2f} MB/min, "
          f"API {trend['api']:+.2f} MB/min")
    print(f"after drain: running {final['running']}, queued {final['queued']}, leak check: {final['leak'] or 'ok'}, "
          f"RSS {final['rss_mb']:.0f} MB")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"kind": "soak", "header": f"{time.strftime('%Y-%m-%d %H:%M')}, {cpu_description()}, "
                       f"{args.minutes:g} min, concurrency {args.concurrency}", "outcomes": dict(outcomes),
                       "memory": memory, "trend_mb_per_min": trend, "leak": final["leak"],
                       "p50_s": lat[len(lat) // 2], "p99_s": lat[int(len(lat) * 0.99)]}, f, indent=1)


def slope(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of y over x (0 with fewer than two points)."""
    if len(points) < 2:
        return 0.0
    mx = sum(x for x, _ in points) / len(points)
    my = sum(y for _, y in points) / len(points)
    var = sum((x - mx) ** 2 for x, _ in points)
    return sum((x - mx) * (y - my) for x, y in points) / var if var else 0.0


def process_rss_mb(pid: int | None) -> float:
    """Resident memory of a local process (the API's; 0 when it is not readable from here)."""
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError, TypeError):
        return 0.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-url", default="http://127.0.0.1:30000")
    ap.add_argument("--minutes", type=float, default=10)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sample-s", type=float, default=60, help="seconds between memory samples")
    ap.add_argument("--warmup-minutes", type=float, default=5, help="the RSS trend is fitted after this")
    ap.add_argument("--out", default=None, help="write the results as JSON (benchmarks/plot.py draws them)")
    asyncio.run(main_async(ap.parse_args()))


if __name__ == "__main__":
    main()
