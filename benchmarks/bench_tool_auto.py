"""tool_choice auto on a real model: does a request that asks for a tool's action get a valid call, and does one
that needs no tool get none? radixlm and llama.cpp's llama-server (``--jinja``, its own tool parsing) on the same
GGUF file, greedy; and the float model (``reference``: transformers in float32 on the dequantized file).

    python benchmarks/bench_tool_auto.py --model qwen2.5-coder-0.5b [--systems radixlm llamaserver reference]
        [--peers-dir ../peers] [--out FILE.json]

Each request offers the 10 tools of bench_tool_calls.py. 20 requests ask for one tool's action (two phrasings of
each tool's request): counted are the answers with a call of that function whose arguments validate against its
schema (jsonschema). 10 requests need no tool: counted are the answers with any call.

Each system's text is also read for calls the model wrote that its parser did not return: a JSON object (bare or
in a ```json fence) whose "name" is one of the tools and whose "arguments" is an object. For llama.cpp, which
returns these forms as text, and for the float model, which has no parser, that count is what the model chose,
so the systems' choices compare directly.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from types import SimpleNamespace

import jsonschema
import openai
from harness import cpu_description, hf_model, hf_tokenizer, radixlm_command, save_result, server
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
MAX_TOKENS = 200
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


def text_calls(content: str | None) -> list[SimpleNamespace]:
    """Calls written in the text as {"name": <a tool>, "arguments": {...}} objects, each parsed where it starts."""
    calls, decoder, text = [], json.JSONDecoder(), content or ""
    for i, ch in enumerate(text):
        if ch != "{":
            continue
        try:
            obj, _ = decoder.raw_decode(text, i)
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict) and obj.get("name") in SCHEMAS and isinstance(obj.get("arguments"), dict):
            fn = SimpleNamespace(name=obj["name"], arguments=json.dumps(obj["arguments"]))
            calls.append(SimpleNamespace(function=fn))
    return calls


def ask(client: openai.OpenAI, text: str):
    r = client.chat.completions.create(model="default", messages=[{"role": "user", "content": text}], tools=TOOLS,
                                       tool_choice="auto", temperature=0, max_tokens=MAX_TOKENS)
    return r.choices[0].message


def served_answers(system: str, path: str, peers: str) -> tuple[list, list]:
    with server(command(system, path, peers)) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", timeout=600)
        return [ask(client, text) for text, _ in ACTIONS], [ask(client, text) for text in NO_TOOL]


def reference_answers(path: str) -> tuple[list, list]:
    """transformers in float32 on the dequantized file, greedy, the same chat template and tools: what the float
    model writes, its calls read from the text."""
    import torch

    tok, model = hf_tokenizer(path), hf_model(path)

    def generate(text: str) -> SimpleNamespace:
        ids = tok.apply_chat_template([{"role": "user", "content": text}], tools=TOOLS, add_generation_prompt=True,
                                      return_dict=True, return_tensors="pt")["input_ids"]
        with torch.inference_mode():
            out = model.generate(ids, max_new_tokens=MAX_TOKENS, do_sample=False)
        return SimpleNamespace(content=tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True), tool_calls=None)

    return [generate(text) for text, _ in ACTIONS], [generate(text) for text in NO_TOOL]


def tally(asked: list, plain: list) -> dict:
    actions = [(text, name, m) for (text, name), m in zip(ACTIONS, asked, strict=True)]
    plain = list(zip(NO_TOOL, plain, strict=True))
    return {"valid_calls": sum(valid_call(m.tool_calls, name) for _, name, m in actions),
            "actions": len(actions), "calls_without_need": sum(bool(m.tool_calls) for _, m in plain),
            "no_tool_requests": len(plain),
            "valid_calls_in_text": sum(valid_call(text_calls(m.content), name) for _, name, m in actions),
            "calls_in_text_without_need": sum(bool(text_calls(m.content)) for _, m in plain),
            "missed": [answer(t, m) for t, name, m in actions if not valid_call(m.tool_calls, name)],
            "unneeded": [answer(t, m) for t, m in plain if m.tool_calls or text_calls(m.content)]}


def answer(request: str, m) -> dict:
    return {"request": request, "content": m.content, "calls": [c.function.model_dump() for c in m.tool_calls or []]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="a GGUF file or a catalog name")
    ap.add_argument("--systems", nargs="+", default=["radixlm", "llamaserver"],
                    choices=["radixlm", "llamaserver", "reference"])
    ap.add_argument("--peers-dir", default=os.path.join(os.path.dirname(__file__), "..", "..", "peers"))
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    path = resolve_model(args.model).path
    results = {}
    for system in args.systems:
        t = time.perf_counter()
        answers = reference_answers(path) if system == "reference" else served_answers(system, path, args.peers_dir)
        results[system] = tally(*answers)
        r = results[system]
        print(f"{system}: {r['valid_calls']} of {r['actions']} action requests got a valid call; "
              f"{r['calls_without_need']} of {r['no_tool_requests']} others got a call; in the text, "
              f"{r['valid_calls_in_text']} valid calls and {r['calls_in_text_without_need']} without need "
              f"({time.perf_counter() - t:.0f} s)",
              flush=True)
    print(f"{os.path.basename(path)}, {cpu_description()}")
    save_result(args.out, benchmark="tool_auto", model=os.path.basename(path), results=results,
                command=" ".join(sys.argv))


if __name__ == "__main__":
    main()
