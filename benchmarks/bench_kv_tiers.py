"""The radix cache's disk tier: agents whose contexts outgrow the KV pool, a restart, and the cost when nothing hits.

    python benchmarks/bench_kv_tiers.py [--agents 8] [--context 3000] [--pool 8192] [--turns 2]
        [--restart-prefix 4096] [--out benchmarks/results/kv_tiers/FILE.json]

Three parts, each against a baseline in the same run (the embedded SmolLM2, greedy, Engine in this process):

* agents: ``--agents`` agents, each with its own ``--context``-token context, take ``--turns`` tool turns (32
  generated tokens, then a 200-token tool result appended); every turn sends all agents at once. The pool
  (``--pool`` tokens) holds only a few contexts, so without the tier each turn recomputes evicted contexts,
  with it they come back from disk. Reports per-turn mean TTFT and wall time, with the tier against without.
* restart: a ``--restart-prefix``-token prefix is computed, written, and the engine shut down; a new engine on
  the same folder (a restart) answers the prefix + 32 new tokens. Its TTFT against a cold one (no tier), with
  the page cache warm and, where this process may drop it (root), cold.
* nothing hits: unique prompts, so the tier only writes. Tokens a second with the tier against without, the
  share of the step the write-through takes on the scheduler's thread, and disk bytes per generated token.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time

from harness import cpu_description, save_result, text_of_tokens

from radixlm.runtime.engine import Engine

NEW, TOOL = 32, 200
GREEDY = {"temperature": 0, "max_new_tokens": NEW, "ignore_eos": True}


def agents(args, disk: str | None) -> list[dict]:
    """Per turn (turn 0 builds the contexts): mean TTFT and wall seconds of all agents' requests."""
    e = Engine(max_total_tokens=args.pool, **({"kv_disk_path": disk} if disk else {}))
    tok = e.tokenizer
    prompts = [text_of_tokens(tok, args.context, seed=10 + a) for a in range(args.agents)]
    turns = []
    for t in range(args.turns + 1):
        start = time.perf_counter()
        outs = e.generate(input_ids=prompts, sampling_params=GREEDY)
        wall = time.perf_counter() - start
        turns.append({"turn": t, "wall_s": round(wall, 3),
                      "ttft_mean_s": round(sum(o["meta_info"]["ttft"] for o in outs) / len(outs), 3),
                      "cached": sum(o["meta_info"]["cached_tokens"] for o in outs),
                      "cached_disk": sum(o["meta_info"]["cached_tokens_disk"] for o in outs)})
        prompts = [p + o["output_ids"] + text_of_tokens(tok, TOOL, seed=1000 * t + a)
                   for a, (p, o) in enumerate(zip(prompts, outs, strict=True))]
        if disk:
            e.core.cache.disk.writer.flush()
    e.shutdown()
    return turns


def ttft(e: Engine, ids: list[int]) -> float:
    return e.generate(input_ids=ids, sampling_params={"temperature": 0, "max_new_tokens": 1})["meta_info"]["ttft"]


def drop_page_cache() -> bool:
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def restart(args, folder: str) -> dict:
    e = Engine()
    prefix = text_of_tokens(e.tokenizer, args.restart_prefix, seed=7)
    tails = [text_of_tokens(e.tokenizer, 32, seed=s) for s in (8, 9, 10)]
    ttft(e, text_of_tokens(e.tokenizer, 64, seed=1))  # warm-up
    cold = ttft(e, prefix + tails[0])
    e.shutdown()
    first = Engine(kv_disk_path=folder)
    ttft(first, prefix + tails[0])
    first.shutdown()  # writes what is queued
    result = {"prefix": args.restart_prefix, "cold_s": round(cold, 3)}
    for name, tail, drop in (("restart_warm_page_cache_s", tails[1], False), ("restart_cold_page_cache_s", tails[2], True)):
        if drop and not drop_page_cache():
            continue
        again = Engine(kv_disk_path=folder)
        result[name] = round(ttft(again, prefix + tail), 3)
        again.shutdown()
    return result


def nothing_hits(args, folder: str | None) -> dict:
    e = Engine(**({"kv_disk_path": folder} if folder else {}))
    prompts = [text_of_tokens(e.tokenizer, 1024, seed=500 + i) for i in range(8)]
    e.generate(input_ids=text_of_tokens(e.tokenizer, 64, seed=2), sampling_params=GREEDY)  # warm-up
    start = time.perf_counter()
    outs = e.generate(input_ids=prompts, sampling_params={**GREEDY, "max_new_tokens": 128})
    wall = time.perf_counter() - start
    out = {"tok_s": round(sum(o["meta_info"]["completion_tokens"] for o in outs) / wall, 2), "wall_s": round(wall, 3)}
    if folder:
        disk = e.core.cache.disk
        disk.writer.flush()
        generated = sum(o["meta_info"]["completion_tokens"] for o in outs)
        out.update(save_share=round(disk.counters.save_s / wall, 4), bytes_written=disk.store.stats.bytes_written,
                   disk_bytes_per_generated_token=round(disk.store.stats.bytes_written / generated))
    e.shutdown()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--agents", type=int, default=8)
    ap.add_argument("--context", type=int, default=3000)
    ap.add_argument("--pool", type=int, default=8192)
    ap.add_argument("--turns", type=int, default=2)
    ap.add_argument("--restart-prefix", type=int, default=4096)
    ap.add_argument("--parts", nargs="+", default=["agents", "restart", "nothing_hits"])
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    root = tempfile.mkdtemp(prefix="radixlm-kv-tiers-")
    res: dict = {"command": "bench_kv_tiers.py " + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in
                                                            vars(args).items() if k not in ("out", "parts"))}
    try:
        if "agents" in args.parts:
            res["agents"] = {"without": agents(args, None), "with": agents(args, os.path.join(root, "agents"))}
        if "restart" in args.parts:
            res["restart"] = restart(args, os.path.join(root, "restart"))
        if "nothing_hits" in args.parts:
            res["nothing_hits"] = {"without": nothing_hits(args, None),
                                   "with": nothing_hits(args, os.path.join(root, "nothing"))}
    finally:
        shutil.rmtree(root, ignore_errors=True)
    report(res)
    save_result(args.out, **res)


def report(res: dict) -> None:
    print(f"\n{time.strftime('%Y-%m-%d %H:%M')}, {cpu_description()}, SmolLM2-135M-Instruct\n{res['command']}")
    if "agents" in res:
        print("| turn | TTFT without (s) | TTFT with (s) | wall without (s) | wall with (s) | wall ratio | disk hits |")
        print("|---|---|---|---|---|---|---|")
        for a, b in zip(res["agents"]["without"], res["agents"]["with"], strict=True):
            print(f"| {a['turn']} | {a['ttft_mean_s']} | {b['ttft_mean_s']} | {a['wall_s']} | {b['wall_s']} | "
                  f"{a['wall_s'] / b['wall_s']:.2f}x | {b['cached_disk']} tokens |")
    if "restart" in res:
        r = res["restart"]
        for k in ("restart_warm_page_cache_s", "restart_cold_page_cache_s"):
            if k in r:
                print(f"restart, {r['prefix']}-token prefix: cold {r['cold_s']} s, {k[:-2]} {r[k]} s: "
                      f"{r['cold_s'] / r[k]:.1f}x")
    if "nothing_hits" in res:
        a, b = res["nothing_hits"]["without"], res["nothing_hits"]["with"]
        print(f"nothing hits: {b['tok_s']} tok/s with the tier, {a['tok_s']} without ({b['tok_s'] / a['tok_s']:.2f}x); "
              f"write-through {b['save_share'] * 100:.2f}% of the wall time on the scheduler's thread; "
              f"{b['disk_bytes_per_generated_token']} disk bytes per generated token")


if __name__ == "__main__":
    main()
