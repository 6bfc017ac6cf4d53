"""Speculative decoding: output tok/s with each method against none, as ratios in the same run.

    python benchmarks/bench_speculative.py [--model NAME_OR_FILE] [--batch 1 8] [--max-new-tokens 96]
                                           [--methods none ngram suffix [draft] [draft-model]]
                                           [--draft-model NAME_OR_FILE] [--rounds 2] [--out FILE]

Workloads (chat template, greedy), each 8 requests a round, another 8 in the next (an agent or an editor sends
similar requests again and again, never the same: the second round may draft from the first's outputs):
  code editing: a file rewritten with one small change each;
  extraction: fields of a document copied into a JSON schema (constrained);
  multi-turn chat: a follow-up turn after an earlier answer;
  agent loop: a tool's output (a listing) repeated with small changes, the answer built from it;
  JSON output: a JSON-schema-constrained object with nothing to copy.
Batch 1 sends a workload's requests one at a time (tok/s: the decode time after the first token); batch 8 sends
them at once, their prompts cached first (tok/s: the batch's output over its wall time). Every method runs with
the defaults (--speculative-adaptive on: it speculates only where it measures that it pays); draft-model is
--speculative-draft-model (--draft-model, e.g. Qwen2.5-Coder-0.5B for the 1.5B). Reported per workload
and batch: tok/s, the ratio against none, the acceptance, and the share of decode steps speculation sat out.
"""

from __future__ import annotations

import argparse
import json
import time

from harness import cpu_description, decode_tok_s, save_result

from radixlm.runtime.config import EngineConfig
from radixlm.runtime.engine import Engine
from radixlm.runtime.model.loader import load_for

CODE = '''import math


def moving_average(values, window):
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


def rms(values):
    """Root mean square of values."""
    if not values:
        return 0.0
    return math.sqrt(sum(v * v for v in values) / len(values))
'''
EDITS = ["Rename the variable `total` to `running_sum`.", "Rename the function `rms` to `root_mean_square`.",
         "Change the error message to 'window must be at least 1'.", "Add type hints to `moving_average`.",
         "Make `rms` return None for an empty list.", "Rename `values` to `xs` in `rms`.",
         "Rename `result` to `averages`.", "Replace `math.sqrt` with `** 0.5` and drop the import.",
         "Rename `window` to `size`.", "Rename `value` to `x` in `moving_average`.",
         "Add a docstring line saying `rms` returns a float.", "Rename the function `moving_average` to `sma`.",
         "Change `total = 0.0` to `total = 0`.", "Rename `i` to `index`.",
         "Raise TypeError if `values` is None in `rms`.", "Rename the module import `math` to `m` (import math as m)."]
DOCS = [f"Shipping notice {88412 + i}. Sender: Northwind Traders Ltd, {221 + i} Baker Street, London NW1 6XE. "
        f"Recipient: Dr. Evelyn Hartmann, Forschungszentrum Jülich, 52428 Jülich. Contents: {12 + i} calibrated "
        f"thermocouples. Carrier: DHL Express, tracking number JD0146000062812{47912 + i}." for i in range(16)]
FIELDS = ("sender", "sender_address", "recipient", "contents", "carrier", "tracking_number")
EXTRACT = {"type": "object", "properties": {k: {"type": "string"} for k in FIELDS}, "required": list(FIELDS)}
PROFILE = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                            "city": {"type": "string"}, "hobbies": {"type": "array", "items": {
                                                "type": "string"}, "maxItems": 3}},
           "required": ["name", "age", "city", "hobbies"]}
ANSWER = ("Radix trees store strings by shared prefixes: each edge holds a run of characters, so common "
          "beginnings are kept once. Lookups walk the edges, comparing runs instead of single characters.")
FOLLOW_UPS = ["Say that again in simpler words.", "Repeat it as two bullet points.", "Now explain it to a child.",
              "Give the same explanation, then one example.", "Summarize it in one sentence.",
              "Restate it, adding where such trees are used.", "Say it again more formally.",
              "Repeat your answer and then add a caveat.", "How does a lookup work in one?",
              "Compare it with a hash table.", "What does inserting a string do to it?",
              "Why do edges hold runs of characters?", "Explain it with an example of three words.",
              "What is its memory cost?", "How is it different from a trie?", "Where would you not use one?"]


def listing(i: int) -> str:
    files = [f"src/module_{k}.py  {1200 + 37 * k} bytes" for k in range(10)] + [f"notes_{i}.txt  {300 + i} bytes"]
    return "\n".join(files)


def workloads() -> dict[str, list[tuple[list[dict], dict]]]:
    """name -> 16 (messages, extra sampling) pairs: 8 a round, so that no request repeats an earlier one."""
    user = lambda text: [{"role": "user", "content": text}]  # noqa: E731
    return {
        "code editing": [(user(f"{e} Output the whole file, nothing else.\n\n{CODE}"), {}) for e in EDITS],
        "extraction": [(user(f"Copy these fields from the document into JSON, verbatim.\n\n{d}"),
                        {"json_schema": json.dumps(EXTRACT)}) for d in DOCS],
        "multi-turn chat": [([{"role": "user", "content": "What is a radix tree?"},
                              {"role": "assistant", "content": ANSWER}, {"role": "user", "content": f}], {})
                            for f in FOLLOW_UPS],
        "agent loop": [(user(f"The tool `ls -l` returned:\n{listing(i)}\n\nList every file it shows, one per line, "
                             "with its size."), {}) for i in range(16)],
        "JSON output": [(user(f"Invent a user profile number {i} as JSON."), {"json_schema": json.dumps(PROFILE)})
                        for i in range(16)],
    }


def run_batch1(engine: Engine, items: list, max_new: int) -> float:
    tokens = seconds = 0.0
    for messages, extra in items:
        m = engine.chat(messages, {"temperature": 0, "max_new_tokens": max_new, **extra})["meta_info"]
        tokens += m["completion_tokens"] - 1
        seconds += m["e2e_latency"] - m["ttft"]
    return tokens / seconds


def run_batch8(engine: Engine, items: list, max_new: int) -> float:
    prompts = [engine.apply_chat_template(m) for m, _ in items]
    params = [{"temperature": 0, "max_new_tokens": max_new, **extra} for _, extra in items]
    return decode_tok_s(engine, prompts, params)[0]


def spec_counts(engine: Engine) -> dict[str, int]:
    sp = engine.scheduler.speculation
    return {**(sp.stats if sp else {}), "decode_steps": engine.scheduler.stats["decode_steps"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8], choices=[1, 8])
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--methods", nargs="+", default=["none", "ngram", "suffix"],
                    choices=["none", "ngram", "suffix", "draft", "draft-model"])
    ap.add_argument("--draft-model", default=None, help="the draft-model method's draft (a model name or file)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--draft-tokens", type=int, default=None, help="--speculative-num-draft-tokens (default: its own)")
    ap.add_argument("--workloads", nargs="+", default=None)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    base = Engine(args.model, progress=False) if args.model else Engine(progress=False)
    extra = {} if args.draft_tokens is None else {"speculative_num_draft_tokens": args.draft_tokens}
    engines = {m: base if m == "none" else Engine.from_model(base.model, base.tokenizer, speculative_algorithm=m,
                                                               **extra) for m in args.methods if m != "draft-model"}
    if "draft-model" in args.methods:
        if args.draft_model is None:
            ap.error("--methods draft-model needs --draft-model")
        draft = load_for(EngineConfig.from_flat(model=args.draft_model), progress=False)[1]
        engines["draft-model"] = Engine.from_model(base.model, base.tokenizer, draft=draft,
                                                   speculative_algorithm="draft", **extra)
    chosen = {k: v for k, v in workloads().items() if args.workloads is None or k in args.workloads}
    run_batch1(base, list(chosen.values())[0][:1], 8)  # warm-up
    rows = []
    for name, items in chosen.items():
        for batch in args.batch:
            rates = {m: [] for m in engines}
            before = {m: spec_counts(e) for m, e in engines.items()}
            for r in range(args.rounds):  # the methods in turn each round: the machine drifts
                part = items[8 * (r % 2):8 * (r % 2) + 8]  # another 8 requests each round
                for m, e in engines.items():
                    rates[m].append(run_batch1(e, part, args.max_new_tokens) if batch == 1
                                    else run_batch8(e, part, args.max_new_tokens))
            for m, e in engines.items():
                after = spec_counts(e)
                d = {k: after.get(k, 0) - before[m].get(k, 0) for k in after}
                rate = sum(rates[m]) / len(rates[m])
                rows.append({"workload": name, "batch": batch, "method": m, "tok_s": round(rate, 1),
                             "rounds": [round(r, 1) for r in rates[m]],
                             "vs_none": round(rate / (sum(rates["none"]) / len(rates["none"])), 3)
                             if "none" in rates else None,
                             "acceptance": round(d["spec_accepted_tokens"] / d["spec_draft_tokens"], 3)
                             if d.get("spec_draft_tokens") else None,
                             "off_share": round(d["spec_off_steps"] / max(d["decode_steps"], 1), 3)
                             if "spec_off_steps" in d else None})
                r = rows[-1]
                print(f"  {name}, batch {batch}, {m}: {r['tok_s']} tok/s ({r['vs_none']}x), acceptance "
                      f"{r['acceptance']}, sat out {r['off_share']}", flush=True)
    model = args.model or "SmolLM2-135M-Instruct"
    print(f"\n{time.strftime('%Y-%m-%d %H:%M')}, {cpu_description()}, {model}, greedy, {args.max_new_tokens} new "
          f"tokens, mean of {args.rounds} rounds")
    print("| workload | batch | method | tok/s | vs none | acceptance | steps sat out |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        acc = "-" if r["acceptance"] is None else f"{100 * r['acceptance']:.0f}%"
        off = "-" if r["off_share"] is None else f"{100 * r['off_share']:.0f}%"
        print(f"| {r['workload']} | {r['batch']} | {r['method']} | {r['tok_s']} | {r['vs_none']}x | {acc} | {off} |")
    save_result(args.out, model=model, max_new_tokens=args.max_new_tokens, rounds=args.rounds, rows=rows)


if __name__ == "__main__":
    main()
