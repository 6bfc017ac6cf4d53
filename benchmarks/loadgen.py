"""The load generator behind bench_serving.py, run_peers.py, bench_invariance.py and bench_parallel.py: requests
from a dataset (random, shared-prefix, multiturn) at a fixed concurrency or Poisson rate against any
OpenAI-compatible server (``main_async(args)``), and their TTFT, TPOT, ITL, E2E latency, throughput and cache
hit rate."""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import time
from dataclasses import dataclass, field

import httpx

WORDS = ("river stone light market garden window letter music winter harbor engine paper silver forest "
         "morning signal bridge valley copper thunder lantern meadow orbit canvas").split()


def words(n_tokens: int, rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n_tokens))  # about one token per word here


@dataclass
class Result:
    ok: bool = False
    error: str = ""
    ttft: float = 0.0
    e2e: float = 0.0
    itl: list[float] = field(default_factory=list)
    prompt_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    chunks: int = 0
    text: str = ""
    stale: bool = False  # the server closed the connection before any response: it never saw the request
    retried: bool = False


async def completion(client: httpx.AsyncClient, base: str, model: str, messages: list[dict], out_len: int,
                     extra: dict) -> Result:
    """One streamed chat request. A pooled keep-alive connection the server closed while it sat idle fails
    the request before any response (llama-server's HTTP library closes idle ones after 5 s): that request
    never reached the server, so it is sent once more, as a browser or the OpenAI client would."""
    res = await attempt(client, base, model, messages, out_len, extra)
    if res.stale:
        res = await attempt(client, base, model, messages, out_len, extra)
        res.retried = True
    return res


async def attempt(client: httpx.AsyncClient, base: str, model: str, messages: list[dict], out_len: int,
                  extra: dict) -> Result:
    body = {"model": model, "messages": messages, "max_tokens": out_len, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}, **extra}
    res, start = Result(), time.perf_counter()
    last = start
    try:
        async with client.stream("POST", f"{base}/v1/chat/completions", json=body) as r:
            if r.status_code != 200:
                res.error = f"HTTP {r.status_code}: {(await r.aread())[:200]!r}"
                return res
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                now = time.perf_counter()
                for c in chunk.get("choices", []):
                    delta = c.get("delta", {}).get("content")
                    if delta:
                        res.chunks += 1
                        if not res.text:
                            res.ttft = now - start
                        else:
                            res.itl.append(now - last)
                        last = now
                        res.text += delta
                if chunk.get("usage"):
                    u = chunk["usage"]
                    res.prompt_tokens, res.output_tokens = u["prompt_tokens"], u["completion_tokens"]
                    res.cached_tokens = (u.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        if not res.output_tokens:  # a server that sends no usage in streams: one chunk is about one token
            res.output_tokens = res.chunks
        res.e2e, res.ok = time.perf_counter() - start, True
    except httpx.HTTPError as e:
        res.error = repr(e)
        res.stale = isinstance(e, httpx.RemoteProtocolError) and "without sending a response" in str(e)
    return res


def dataset(args, rng: random.Random) -> list[list[list[dict]]]:
    """A list of sessions; each session is a list of turns (message lists are built as it runs)."""
    if args.dataset == "random":
        return [[[{"role": "user", "content": words(args.input_len, rng)}]] for _ in range(args.num_prompts)]
    if args.dataset == "shared-prefix":
        systems = [words(args.system_len, rng) for _ in range(args.groups)]
        sessions = [[[{"role": "system", "content": systems[g]}, {"role": "user", "content": words(args.question_len, rng)}]]
                    for _ in range(args.per_group) for g in range(args.groups)]
        if args.shuffle:  # arrival order independent of the group (else round robin partitions groups by luck)
            rng.shuffle(sessions)
        return sessions
    return [[[{"role": "user", "content": words(args.input_len, rng)}] for _ in range(args.turns)]
            for _ in range(args.conversations)]


async def run_session(client, args, turns, extra) -> list[Result]:
    history, results = [], []
    for turn in turns:
        history += turn
        r = await completion(client, args.base_url, args.model, history, args.output_len, extra)
        results.append(r)
        history.append({"role": "assistant", "content": r.text})
    return results


async def main_async(args) -> dict:
    rng = random.Random(args.seed)
    sessions = dataset(args, rng)
    extra = json.loads(args.extra_body) if args.extra_body else {}
    limits = httpx.Limits(max_connections=max(args.concurrency, 1) * 2 + 8)
    async with httpx.AsyncClient(timeout=args.timeout, limits=limits) as client:
        sem = asyncio.Semaphore(args.concurrency if args.request_rate <= 0 else 10**6)

        async def guarded(s):
            async with sem:
                return await run_session(client, args, s, extra)

        start = time.perf_counter()
        tasks = []
        for s in sessions:
            tasks.append(asyncio.create_task(guarded(s)))
            if args.request_rate > 0:
                await asyncio.sleep(rng.expovariate(args.request_rate))
        results = [r for rs in await asyncio.gather(*tasks) for r in rs]
        wall = time.perf_counter() - start
    return summarize(results, wall)


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return 0.0
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def summarize(results: list[Result], wall: float) -> dict:
    ok = [r for r in results if r.ok]
    tpot = [(r.e2e - r.ttft) / (r.output_tokens - 1) for r in ok if r.output_tokens > 1]
    itl = [x for r in ok for x in r.itl]
    out_tokens, prompt_tokens = sum(r.output_tokens for r in ok), sum(r.prompt_tokens for r in ok)
    stats = {"requests": len(results), "errors": len(results) - len(ok), "retried": sum(r.retried for r in results),
             "duration_s": wall,
             "request_throughput": len(ok) / wall, "output_throughput": out_tokens / wall,
             "total_throughput": (out_tokens + prompt_tokens) / wall,
             "cache_hit_rate": sum(r.cached_tokens for r in ok) / max(prompt_tokens, 1)}
    for name, xs in (("ttft", [r.ttft for r in ok]), ("tpot", tpot), ("itl", itl), ("e2e", [r.e2e for r in ok])):
        stats[f"mean_{name}_ms"] = 1000 * statistics.fmean(xs) if xs else 0.0
        stats[f"p50_{name}_ms"] = 1000 * pct(xs, 0.5)
        stats[f"p99_{name}_ms"] = 1000 * pct(xs, 0.99)
    errors = sorted({r.error for r in results if not r.ok})
    if errors:
        stats["error_samples"] = errors[:3]
    return stats
