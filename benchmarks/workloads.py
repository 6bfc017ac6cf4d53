"""Workloads the benchmark scripts share: the served workloads A-E (run_peers.py, bench_invariance.py) run
against a server's URL, and the tool set with one request for each tool (bench_tool_calls.py,
bench_tool_auto.py)."""

from __future__ import annotations

import argparse
import asyncio
import json

from loadgen import main_async

SCHEMA = {"type": "object", "properties": {"topic": {"type": "string"}, "words": {"type": "integer"},
                                           "summary": {"type": "string"}}, "required": ["topic", "words", "summary"]}
WORKLOADS = {
    "A": {"dataset": "random", "num_prompts": 32, "input_len": 200, "output_len": 64, "concurrency": 8},
    "B": {"dataset": "shared-prefix", "groups": 1, "per_group": 32, "system_len": 1000, "question_len": 30,
          "output_len": 32, "concurrency": 8},
    "C": {"dataset": "random", "num_prompts": 1, "input_len": 128, "output_len": 256, "concurrency": 1},
    "D": {"dataset": "multiturn", "conversations": 8, "turns": 4, "input_len": 60, "output_len": 32, "concurrency": 8},
    "E": {"dataset": "random", "num_prompts": 16, "input_len": 100, "output_len": 64, "concurrency": 8,
          "constrained": True},
}
BASE = {"model": "default", "num_prompts": 32, "input_len": 200, "output_len": 64, "groups": 4, "per_group": 8,
        "system_len": 1000, "question_len": 30, "conversations": 8, "turns": 4, "concurrency": 8,
        "request_rate": 0.0, "timeout": 1800, "seed": 0, "shuffle": False}


def extra_body(system: str, constrained: bool) -> dict:
    body = {"ignore_eos": True} if system != "llamacpp" else {}
    if constrained:
        body["response_format"] = ({"type": "json_object", "schema": SCHEMA} if system == "llamacpp" else
                                   {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA}})
    return body


def run_workloads(url: str, system: str, workloads: list[str]) -> dict:
    """Each workload against the server at ``url`` after a small warm-up of it -> {workload: loadgen's
    summary}; ``system``: which server it is (its extra body: llama-cpp-python takes no ignore_eos)."""
    out = {}
    for w in workloads:
        spec = dict(WORKLOADS[w])
        constrained = spec.pop("constrained", False)
        args = argparse.Namespace(**{**BASE, **spec, "base_url": url,
                                     "extra_body": json.dumps(extra_body(system, constrained))})
        asyncio.run(main_async(argparse.Namespace(**{**vars(args), "num_prompts": 2, "conversations": 1,
                                                     "per_group": 2, "output_len": 8})))  # warm-up
        out[w] = asyncio.run(main_async(args))
        print(f"  {system} {w}: {out[w]['output_throughput']:.1f} tok/s, TTFT {out[w]['mean_ttft_ms']:.0f} ms, "
              f"TPOT {out[w]['mean_tpot_ms']:.1f} ms, errors {out[w]['errors']}, retried {out[w]['retried']}",
              flush=True)
    return out


# ------------------------------------------------------------ the tool set
def fn(name: str, desc: str, props: dict, required: list[str]) -> dict:
    return {"type": "function", "function": {"name": name, "description": desc, "parameters": {
        "type": "object", "properties": props, "required": required}}}


S = {"type": "string", "maxLength": 24}
TOOLS = [
    fn("get_weather", "Weather forecast", {"city": S, "days": {"type": "integer", "minimum": 1, "maximum": 14}},
       ["city", "days"]),
    fn("convert_currency", "Convert money", {"amount": {"type": "number"}, "from": {"enum": ["USD", "EUR", "JPY"]},
                                             "to": {"enum": ["USD", "EUR", "JPY"]}}, ["amount", "from", "to"]),
    fn("search_web", "Search", {"query": S, "max_results": {"type": "integer", "minimum": 1, "maximum": 10}},
       ["query"]),
    fn("send_email", "Send an email", {"to": S, "subject": S, "urgent": {"type": "boolean"}}, ["to", "subject"]),
    fn("create_event", "Calendar event", {"title": S, "when": {"type": "object", "properties": {
        "date": {"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"},
        "hour": {"type": "integer", "minimum": 0, "maximum": 23}}, "required": ["date", "hour"]}},
       ["title", "when"]),
    fn("add_items", "Shopping list", {"items": {"type": "array", "items": S, "minItems": 1, "maxItems": 5}},
       ["items"]),
    fn("set_thermostat", "Temperature", {"celsius": {"type": "number", "minimum": 5, "maximum": 30},
                                         "room": {"enum": ["kitchen", "bedroom", "office"]}}, ["celsius", "room"]),
    fn("book_table", "Restaurant booking", {"restaurant": S, "people": {"type": "integer", "minimum": 1,
                                                                        "maximum": 12}, "note": S},
       ["restaurant", "people"]),
    fn("translate", "Translate text", {"text": S, "target": {"type": "string", "enum": ["fr", "de", "ja", "es"]}},
       ["text", "target"]),
    fn("rate_movie", "Rate a movie", {"title": S, "stars": {"type": "integer", "minimum": 1, "maximum": 5},
                                      "tags": {"type": "array", "items": {"type": "string", "maxLength": 12},
                                               "maxItems": 3}}, ["title", "stars"]),
]
ASKS = ["What's the weather in Lima this week?", "Convert 120 euros to yen.", "Search for radix trees.",
        "Email bob@example.com about the meeting.", "Put lunch with Ann on 2026-12-03 at noon in my calendar.",
        "Add milk and eggs to my list.", "Make the office 21 degrees.", "Book a table for 4 at Nopa.",
        "Translate 'good morning' to Japanese.", "Rate Alien five stars."]
