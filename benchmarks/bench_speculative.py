"""Speculative decoding: decode tokens/s with and without each proposer, as ratios in the same run.

    python benchmarks/bench_speculative.py [--max-new-tokens 128 --draft-layers 8]

Workloads (chat template, greedy, one request at a time: single-stream decode is where speculation pays):
  extraction: copy fields of a provided document into a JSON schema (constrained);
  code editing: rewrite a given function with one change;
  plain chat: open-ended questions.
Decode speed = (completion tokens - 1) / (end-to-end time - time to first token), summed over the prompts.
"""

from __future__ import annotations

import argparse
import json

from radixlm.runtime.engine import Engine

DOC = ("Shipping notice 88412. Sender: Northwind Traders Ltd, 221 Baker Street, London NW1 6XE, United Kingdom. "
       "Recipient: Dr. Evelyn Hartmann, Forschungszentrum Jülich, Wilhelm-Johnen-Straße, 52428 Jülich, Germany. "
       "Contents: 12 calibrated thermocouples (type K), 3 vacuum flanges DN40CF, 1 turbomolecular pump HiPace 80. "
       "Declared value: 14,250.00 EUR. Carrier: Deutsche Post DHL Express, tracking number JD014600006281247912.")
SCHEMA = {"type": "object", "properties": {k: {"type": "string"} for k in
                                           ("sender", "sender_address", "recipient", "recipient_address",
                                            "contents", "declared_value", "carrier", "tracking_number")},
          "required": ["sender", "sender_address", "recipient", "recipient_address", "contents",
                       "declared_value", "carrier", "tracking_number"]}
CODE = '''def moving_average(values, window):
    """Return the moving averages of values over the given window."""
    if window <= 0:
        raise ValueError("window must be positive")
    result = []
    total = 0.0
    for i, value in enumerate(values):
        total += value
        if i >= window:
            total -= values[i - window]
        if i >= window - 1:
            result.append(total / window)
    return result
'''
WORKLOADS = {
    "extraction": [(f"Copy these fields from the document into JSON, verbatim.\n\n{DOC}", {"json_schema": json.dumps(SCHEMA)}),
                   (f"Extract the sender, recipient and carrier, copying the text exactly.\n\n{DOC}",
                    {"json_schema": json.dumps(SCHEMA)})],
    "code editing": [(f"Rename the variable `total` to `running_sum` in this function. Output the whole function.\n\n{CODE}", {}),
                     (f"Add type hints to this function and output the whole function.\n\n{CODE}", {})],
    "plain chat": [("Why is the sky blue? Answer in a paragraph.", {}),
                   ("Give me three ideas for a weekend trip and say why.", {})],
}


def decode_time(engine: Engine, prompts: list[tuple[str, dict]], max_new: int) -> tuple[float, float]:
    """-> (decoded tokens, decode seconds) over the prompts, one at a time."""
    tokens = seconds = 0.0
    for text, extra in prompts:
        engine.flush_cache()
        r = engine.chat([{"role": "user", "content": text}], {"temperature": 0, "max_new_tokens": max_new, **extra})
        m = r["meta_info"]
        tokens += m["completion_tokens"] - 1
        seconds += m["e2e_latency"] - m["ttft"]
    return tokens, seconds


def spec_summary(engine: Engine) -> tuple[float | None, float | None]:
    st = engine.scheduler.speculation.stats if engine.scheduler.speculation else None
    if not st:
        return None, None
    return st["spec_accepted_tokens"] / max(st["spec_draft_tokens"], 1), \
        1 + st["spec_accepted_tokens"] / max(st["spec_verify_steps"], 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--draft-layers", type=int, default=8)
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--repeats", type=int, default=3, help="rounds over the configs, interleaved (noise)")
    args = ap.parse_args()
    configs = {"off": {}, "ngram": {"speculative_algorithm": "ngram"},
               f"draft ({args.draft_layers} layers)": {"speculative_algorithm": "draft",
                                                       "speculative_draft_layers": args.draft_layers}}
    base = Engine(dtype=args.dtype, progress=False)
    engines = {name: base if not cfg else Engine.from_model(base.model, base.tokenizer, **cfg)
               for name, cfg in configs.items()}
    decode_time(base, WORKLOADS["plain chat"][:1], 8)  # warm-up
    print(f"\nSpeculative decoding, one request at a time, greedy, {args.max_new_tokens} new tokens, {base.dtype}")
    print("| workload | config | decode tok/s | vs off | accepted drafts | tokens per verify step |")
    print("|---|---|---|---|---|---|")
    for wname, prompts in WORKLOADS.items():
        totals = {name: [0.0, 0.0] for name in engines}
        for engine in engines.values():
            if engine.scheduler.speculation:
                engine.scheduler.speculation.stats = dict.fromkeys(engine.scheduler.speculation.stats, 0)
        for _ in range(args.repeats):
            for name, engine in engines.items():
                tokens, seconds = decode_time(engine, prompts, args.max_new_tokens)
                totals[name][0] += tokens
                totals[name][1] += seconds
        speed = {name: t / s for name, (t, s) in totals.items()}
        for name, engine in engines.items():
            accept, length = spec_summary(engine)
            acc = "-" if accept is None else f"{100 * accept:.0f}%"
            length = "-" if length is None else f"{length:.2f}"
            print(f"| {wname} | {name} | {speed[name]:.1f} | {speed[name] / speed['off']:.2f}x | {acc} | {length} |")


if __name__ == "__main__":
    main()
