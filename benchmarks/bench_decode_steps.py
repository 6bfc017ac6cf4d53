"""Decode with steps run back to back (``decode_steps``) against one step at a time, in one process.

    python benchmarks/bench_decode_steps.py [--batch 1 8] [--steps 1 4] [--tokens 128] [--rounds 5]
        [--temperature 0.7 --top-p 0.95] [--logprobs N] [--group-ms MS] [--out FILE.json]

One Engine per ``decode_steps`` value on the embedded SmolLM2 (the defaults otherwise), ``ignore_eos``; greedy, or
with ``--temperature`` sampled (request i seeded with i, so every setting must draw the same tokens); with
``--logprobs N`` every request asks for its tokens' logprobs and the top N (which must be the same too);
the rounds alternate between them, each round every batch size: the same prompts (cached after a first
request), ``--tokens`` new tokens each. Prints the median output tok/s of each setting, its ratio to the first
setting's, and checks that every setting generated the same tokens.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from harness import cpu_description, decode_tok_s, save_result, text_of_tokens


def decode_round(engine, prompts: list[list[int]], tokens: int, sampling: dict,
                 logprobs: int | None) -> tuple[float, list]:
    """-> output tok/s of one batch, and its output ids (with their logprobs, if asked)."""
    params = [{**sampling, "max_new_tokens": tokens, "seed": i} for i in range(len(prompts))]
    asked = {} if logprobs is None else {"return_logprob": True, "top_logprobs_num": logprobs}
    rate, outs = decode_tok_s(engine, prompts, params, **asked)
    return rate, [(o["output_ids"], o["meta_info"].get("output_token_logprobs"),
                   o["meta_info"].get("output_top_logprobs")) for o in outs]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--steps", type=int, nargs="+", default=[1, 4], help="decode_steps values; the first is the baseline")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    ap.add_argument("--group-ms", type=float, default=None, help="decode_group_ms (default: the engine's)")
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--logprobs", type=int, default=None, help="ask for logprobs and the top N of every token")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    sampling = {"temperature": args.temperature, "top_p": args.top_p}
    from radixlm.runtime.engine import Engine

    group = {} if args.group_ms is None else {"decode_group_ms": args.group_ms}
    engines = {s: Engine(progress=False, decode_steps=s, **group) for s in args.steps}
    tok = engines[args.steps[0]].tokenizer
    prompts = {b: [text_of_tokens(tok, args.prompt_len, seed=i) for i in range(b)] for b in args.batch}
    rates = {(s, b): [] for s in args.steps for b in args.batch}
    outputs: dict[tuple[int, int], list] = {}
    for _ in range(args.rounds):
        for b in args.batch:
            for s in args.steps:
                rate, ids = decode_round(engines[s], prompts[b], args.tokens, sampling, args.logprobs)
                rates[s, b].append(rate)
                outputs.setdefault((s, b), ids)
    same = all(outputs[s, b] == outputs[args.steps[0], b] for s in args.steps for b in args.batch)
    header = f"{time.strftime('%Y-%m-%d %H:%M')}, {cpu_description()}, SmolLM2-135M Engine defaults"
    how = "greedy" if args.temperature == 0 else f"temperature {args.temperature}, top_p {args.top_p}"
    how += "" if args.logprobs is None else f", logprobs with the top {args.logprobs}"
    how += f", decode_group_ms {engines[args.steps[0]].config.scheduler.decode_group_ms:g}"
    print(f"\n{header}, {args.tokens} tokens ({how}) after a {args.prompt_len}-token prompt, median of {args.rounds}")
    print("| batch | " + " | ".join(f"decode_steps {s}" for s in args.steps) + " |")
    print("|---|" + "---|" * len(args.steps))
    base = {b: statistics.median(rates[args.steps[0], b]) for b in args.batch}
    for b in args.batch:
        cells = [f"{statistics.median(rates[s, b]):.1f} tok/s ({statistics.median(rates[s, b]) / base[b]:.2f}x)"
                 for s in args.steps]
        print(f"| {b} | " + " | ".join(cells) + " |")
    print(f"same tokens (and logprobs) in every setting: {same}")
    save_result(args.out, tokens=args.tokens, prompt_len=args.prompt_len, sampling=sampling, logprobs=args.logprobs,
                same_tokens=same,
                rates={f"steps{s}_batch{b}": r for (s, b), r in rates.items()})
    if not same:
        sys.exit("the settings generated different tokens")


if __name__ == "__main__":
    main()
