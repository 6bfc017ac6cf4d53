"""Sampled tool-call turns at temperature 1 over 10 tool schemas: does every call that starts parse and validate?

    python benchmarks/bench_tool_calls.py [--turns 200] [--url URL] [--out benchmarks/results/tool_calls/FILE.json]

Each turn offers all 10 tools and asks for one of them, with tool_choice cycling through auto, auto with a
logit bias toward the trigger, required and the named function. Counted per mode: turns that started a call,
calls that parse as JSON, calls whose arguments validate against their function's schema (jsonschema), calls
and turns cut by max_tokens, and turns that answered in text. Without --url it starts `radixlm serve` (the defaults) and stops it after.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import openai
from harness import cpu_description, radixlm_command, start_server, stop_server
from workloads import ASKS, TOOLS

SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
MODES = ("auto", "auto_biased", "required", "named")
# auto_biased: auto with logit_bias toward "<" and "tool" (the trigger <tool_call> is < tool _ call > in
# SmolLM2's vocabulary), so that the 135M model starts calls of its own accord more often
TRIGGER_BIAS = {"44": 6.0, "19324": 4.0}


def one_turn(client: openai.OpenAI, k: int) -> dict:
    mode, name = MODES[k % len(MODES)], TOOLS[k % 10]["function"]["name"]
    choice = {"type": "function", "function": {"name": name}} if mode == "named" else mode.removesuffix("_biased")
    r = client.chat.completions.create(model="default", messages=[{"role": "user", "content": ASKS[k % 10]}],
                                       tools=TOOLS, tool_choice=choice, temperature=1.0, seed=k, max_tokens=160,
                                       logit_bias=TRIGGER_BIAS if mode == "auto_biased" else None)
    c = r.choices[0]
    out = {"mode": mode, "finish": c.finish_reason, "calls": 0, "parsed": 0, "valid": 0, "tokens":
           r.usage.completion_tokens, "text": not c.message.tool_calls}
    for call in c.message.tool_calls or []:
        out["calls"] += 1
        try:
            args = json.loads(call.function.arguments)
        except json.JSONDecodeError:
            continue
        out["parsed"] += 1
        try:
            jsonschema.validate(args, SCHEMAS[call.function.name])
            out["valid"] += 1
        except jsonschema.ValidationError:
            pass
    out["cut_calls"] = int(c.finish_reason == "length" and out["calls"] > 0)  # the last call ran out of tokens
    return out


def summarize(turns: list[dict]) -> dict:
    rows = {}
    for mode in MODES:
        mine = [t for t in turns if t["mode"] == mode]
        rows[mode] = {"turns": len(mine), "turns_with_calls": sum(t["calls"] > 0 for t in mine),
                      "calls": sum(t["calls"] for t in mine), "cut_calls": sum(t["cut_calls"] for t in mine),
                      "parsed": sum(t["parsed"] for t in mine),
                      "valid": sum(t["valid"] for t in mine), "cut_by_max_tokens": sum(t["finish"] == "length"
                                                                                       for t in mine),
                      "text_answers": sum(t["text"] for t in mine)}
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--turns", type=int, default=200)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--url", default=None)
    ap.add_argument("--chat-template", default=None, help="serve with this template (e.g. tests/templates/"
                    "qwen_tools.jinja, which renders the tools itself)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    flags = ("--chat-template", os.path.abspath(args.chat_template)) if args.chat_template else ()
    proc, url = (None, args.url) if args.url else start_server(radixlm_command(*flags), timeout=300)
    try:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", timeout=600)
        t = time.perf_counter()
        with ThreadPoolExecutor(args.concurrency) as pool:
            turns = list(pool.map(lambda k: one_turn(client, k), range(args.turns)))
        wall = time.perf_counter() - t
    finally:
        if proc is not None:
            stop_server(proc)
    rows = summarize(turns)
    template = os.path.basename(args.chat_template) if args.chat_template else "the model's"
    header = (f"{time.strftime('%Y-%m-%d %H:%M')}, {cpu_description()}, SmolLM2-135M-Instruct, T=1, {args.turns} "
              f"turns, template {template}")
    print(f"\n{header} ({wall:.0f} s)\n| tool_choice | turns | turns with calls | calls | of them cut by max_tokens "
          "| parse | validate | turns cut by max_tokens | text answers |\n|---|---|---|---|---|---|---|---|---|")
    for mode, r in rows.items():
        print(f"| {mode} | {r['turns']} | {r['turns_with_calls']} | {r['calls']} | {r['cut_calls']} | {r['parsed']} | {r['valid']} | "
              f"{r['cut_by_max_tokens']} | {r['text_answers']} |")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"kind": "tool_calls", "header": header, "wall_s": wall, "rows": rows, "turns": turns}, f,
                      indent=1)


if __name__ == "__main__":
    main()
