"""CPU time each server process spends per streamed token: what the API process (which detokenizes) and the
streaming client take from the two cores the scheduler's forward pass runs on.

    python benchmarks/bench_stream_cpu.py [--tokens 256] [--rounds 1] [--out benchmarks/results/stream_cpu/FILE.json]

Plain `radixlm serve` (started ``--rounds`` times), one greedy chat stream (``ignore_eos``) after a
warm-up one; each process's user + system CPU time over the stream (psutil), the client's included, divided
by the tokens, beside the stream's rate.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import httpx
import psutil
from harness import cpu_description, save_result, wait_healthy

PORT = 31556
URL = f"http://127.0.0.1:{PORT}"


def stream(tokens: int) -> float:
    body = {"messages": [{"role": "user", "content": "Tell me a long story about a dragon."}], "max_tokens": tokens,
            "temperature": 0, "ignore_eos": True, "stream": True}
    start = time.perf_counter()
    with httpx.stream("POST", f"{URL}/v1/chat/completions", json=body, timeout=300) as r:
        for _ in r.iter_lines():
            pass
    return time.perf_counter() - start


def processes(server: psutil.Process) -> dict[str, psutil.Process]:
    """The server's processes by role: the API (the server's own) and the scheduler."""
    sched = httpx.get(f"{URL}/server_info", timeout=5).json()["scheduler_pid"]
    return {"api": server, "scheduler": psutil.Process(sched)}


def measure(tokens: int) -> dict:
    """One server: a warm-up stream, then CPU ms per token of each process, the client's (this one) included."""
    proc = psutil.Popen([sys.executable, "-m", "radixlm.runtime", "serve", "--port", str(PORT)],
                        stdout=open(os.devnull, "w"), stderr=open(os.devnull, "w"))
    try:
        wait_healthy(proc, URL)
        roles = {**processes(proc), "client": psutil.Process()}
        stream(16)
        before = {k: sum(p.cpu_times()[:4]) for k, p in roles.items()}
        wall = stream(tokens)
        ms = {k: (sum(p.cpu_times()[:4]) - before[k]) / tokens * 1e3 for k, p in roles.items()}
    finally:
        proc.terminate()
        proc.wait()
    return {"tok_s": tokens / wall, "cpu_ms_per_token": ms}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=1, help="servers started in turn (the machine drifts)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    runs = [measure(args.tokens) for _ in range(args.rounds)]
    print(f"\n{time.strftime('%Y-%m-%d %H:%M')}, {cpu_description()}, one stream of {args.tokens} tokens:")
    for r in runs:
        print(f"  {r['tok_s']:6.1f} tok/s; CPU ms per token: "
              + ", ".join(f"{k} {v:.2f}" for k, v in r["cpu_ms_per_token"].items()))
    save_result(args.out, tokens=args.tokens, runs=runs)


if __name__ == "__main__":
    main()
