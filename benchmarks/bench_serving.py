"""Load generator for any OpenAI-compatible server (SGLang's bench_serving in spirit; the work is loadgen.py's).

    python benchmarks/bench_serving.py --base-url http://127.0.0.1:30000 --dataset random \
        --num-prompts 32 --input-len 200 --output-len 64 --concurrency 8
    --dataset shared-prefix --groups 4 --per-group 8 --system-len 1000 --question-len 30
    --dataset multiturn --conversations 8 --turns 4
    --request-rate 4   (Poisson arrivals instead of fixed concurrency)

Reports TTFT, TPOT, ITL and E2E latency (mean, p50, p99), request and token throughput, and the cache hit
rate from usage.prompt_tokens_details.cached_tokens (where the server reports it).
"""

from __future__ import annotations

import argparse
import asyncio
import json

from loadgen import main_async


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-url", default="http://127.0.0.1:30000")
    ap.add_argument("--model", default="default")
    ap.add_argument("--dataset", choices=("random", "shared-prefix", "multiturn"), default="random")
    ap.add_argument("--num-prompts", type=int, default=32)
    ap.add_argument("--input-len", type=int, default=200)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--groups", type=int, default=4)
    ap.add_argument("--per-group", type=int, default=8)
    ap.add_argument("--system-len", type=int, default=1000)
    ap.add_argument("--question-len", type=int, default=30)
    ap.add_argument("--shuffle", action="store_true", help="shared-prefix: send the groups' requests in random order")
    ap.add_argument("--conversations", type=int, default=8)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--request-rate", type=float, default=0.0, help="Poisson arrivals per second (0: all at once)")
    ap.add_argument("--extra-body", default="", help='JSON merged into each request, e.g. {"ignore_eos": true}')
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    stats = asyncio.run(main_async(args))
    if args.json:
        print(json.dumps(stats))
        return
    for k, v in stats.items():
        print(f"{k:>22}: {v:.3f}" if isinstance(v, float) else f"{k:>22}: {v}")


if __name__ == "__main__":
    main()
