"""tool_choice auto on a real model: does a request that asks for a tool's action get a valid call, and does one
that needs no tool get none? radixlm and llama.cpp's llama-server (``--jinja``, its own tool parsing) on the same
GGUF file, greedy.

    python benchmarks/bench_tool_auto.py --model qwen2.5-coder-0.5b [--systems radixlm llamaserver]
        [--peers-dir ../peers] [--out FILE.json]

Each request offers the 10 tools of bench_tool_calls.py. 20 requests ask for one tool's action (two phrasings of
each tool's request): counted are the answers with a call of that function whose arguments validate against its
schema (jsonschema). 10 requests need no tool: counted are the answers with any call.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import jsonschema
import openai
from harness import cpu_description, radixlm_command, save_result, server
from workloads import ASKS, TOOLS

from radixlm.kernels.cpu_info import core_budget
from radixlm.runtime.model.sources import resolve_model

# (request, the function it asks for): ASKS, then the same actions asked another way
ACTIONS = [*zip(ASKS, [t["function"]["name"] for t in TOOLS], strict=True), *zip([
    "Will it rain in Oslo over the next 3 days?", "How many dollars is 50 EUR?", "Look up the latest news on CPUs.",
    "Send an urgent email to ann@example.com titled 'Build broken'.", "Schedule a dentist visit on 2026-12-10 at 9.",
    "I need bread and butter on the shopping list.", "Set the bedroom to 19 degrees celsius.",
    "Reserve a table for two at Chez Panisse.", "How do you say 'thank you' in German?",
    "Give The Matrix four stars."], [t["function"]["name"] for t in TOOLS], strict=True)]
NO_TOOL = ["What is 17 times 23?", "Write a haiku about autumn.", "Explain what a radix tree is in two sentences.",
           "Say hello in French.", "What is the capital of Japan?", "Write a Python one-liner that reverses a string.",
           "Who wrote Pride and Prejudice?", "Give me a synonym for 'quick'.", "What does HTTP stand for?",
           "Summarize the plot of Cinderella in one sentence."]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


def command(system: str, path: str, peers: str) -> list[str]:
    if system == "radixlm":
        return radixlm_command("--model", path)
    return [os.path.join(peers, "llama-server"), "-m", path, "-t", str(core_budget()), "-c", "8192", "--jinja",
            "-a", "default"]


def valid_call(calls, name: str) -> bool:
    for call in calls or []:
        if call.function.name != name:
            continue
        try:
            jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[name])
            return True
        except (json.JSONDecodeError, jsonschema.ValidationError):
            pass
    return False


def ask(client: openai.OpenAI, text: str):
    r = client.chat.completions.create(model="default", messages=[{"role": "user", "content": text}], tools=TOOLS,
                                       tool_choice="auto", temperature=0, max_tokens=200)
    return r.choices[0].message


def run_system(system: str, path: str, peers: str) -> dict:
    with server(command(system, path, peers)) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", timeout=600)
        actions = [(text, name, ask(client, text)) for text, name in ACTIONS]
        plain = [(text, ask(client, text)) for text in NO_TOOL]
    return {"valid_calls": sum(valid_call(m.tool_calls, name) for _, name, m in actions),
            "actions": len(actions), "calls_without_need": sum(bool(m.tool_calls) for _, m in plain),
            "no_tool_requests": len(plain),
            "missed": [answer(t, m) for t, name, m in actions if not valid_call(m.tool_calls, name)],
            "unneeded": [answer(t, m) for t, m in plain if m.tool_calls]}


def answer(request: str, m) -> dict:
    return {"request": request, "content": m.content, "calls": [c.function.model_dump() for c in m.tool_calls or []]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="a GGUF file or a catalog name")
    ap.add_argument("--systems", nargs="+", default=["radixlm", "llamaserver"], choices=["radixlm", "llamaserver"])
    ap.add_argument("--peers-dir", default=os.path.join(os.path.dirname(__file__), "..", "..", "peers"))
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    path = resolve_model(args.model).path
    results = {}
    for system in args.systems:
        t = time.perf_counter()
        results[system] = run_system(system, path, args.peers_dir)
        r = results[system]
        print(f"{system}: {r['valid_calls']} of {r['actions']} action requests got a valid call; "
              f"{r['calls_without_need']} of {r['no_tool_requests']} others got a call ({time.perf_counter() - t:.0f} s)",
              flush=True)
    print(f"{os.path.basename(path)}, {cpu_description()}")
    save_result(args.out, benchmark="tool_auto", model=os.path.basename(path), results=results,
                command=" ".join(sys.argv))


if __name__ == "__main__":
    main()
