"""SGLang-paper-style workloads written as DSL programs, radix cache on vs off in the same run.

    python benchmarks/bench_lang.py [--items 16]

Each workload runs through an in-process EngineBackend (no HTTP), once with the radix cache and once with
--disable-radix-cache, on the same model. Prints throughput ratios and the cache hit rate.
"""

from __future__ import annotations

import argparse
import json
import time

import radixlm.lang as sgl
from radixlm.runtime.engine import Engine

EXAMPLES = "".join(f"Question: Which is larger, {a} or {a + 7}?\nAnswer: {a + 7}\n" for a in range(1, 40))


@sgl.function
def mmlu_like(s, a):
    s += EXAMPLES + f"Question: Which is larger, {a} or {a + 3}?\nAnswer:"
    s += sgl.select("answer", [f" {a}", f" {a + 3}"])


@sgl.function
def tree_of_thought(s, topic):
    s += EXAMPLES + f"Plan an essay about {topic}.\n"
    ideas = s.fork(3)
    ideas += lambda i: f"Idea {i + 1}:" + sgl.gen("idea", max_tokens=12, temperature=0.7, seed=i)
    for idea in ideas:
        checks = idea.fork(2)
        checks += lambda i: "\nGood idea? " + sgl.select("ok", ["yes", "no"])
        checks.join()
    ideas.join()


SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120}},
          "required": ["name", "age"]}


@sgl.function
def extraction(s, i):
    s += EXAMPLES + f"Person {i}: Sam, aged {20 + i}.\nJSON: "
    s += sgl.gen("json", json_schema=json.dumps(SCHEMA), max_tokens=32, temperature=0)


@sgl.function
def multi_turn(s, i):
    s += sgl.system(EXAMPLES)
    for turn in range(3):
        s += sgl.user(f"Turn {turn}: tell me about number {i + turn}.")
        s += sgl.assistant(sgl.gen(f"a{turn}", max_tokens=12, temperature=0))


@sgl.function
def react(s, i):
    s += EXAMPLES + f"Task {i}: find the larger of {i} and {i * 2}.\n"
    for step in range(3):
        s += f"Thought {step}:" + sgl.gen(f"t{step}", max_tokens=10, temperature=0, stop="\n") + "\n"
        s += f"Action {step}: " + sgl.select(f"act{step}", ["search", "compare", "finish"]) + "\n"
        s += f"Observation {step}: {i * (step + 1)}\n"


WORKLOADS = {"few-shot select": (mmlu_like, "a"), "tree of thought": (tree_of_thought, "topic"),
             "JSON extraction": (extraction, "i"), "multi-turn chat": (multi_turn, "i"),
             "ReAct agent": (react, "i")}


def run(program, arg: str, items: int, backend) -> tuple[float, float]:
    backend.engine.flush_cache()
    stats = backend.engine.scheduler.stats
    p0, c0 = stats["prompt_tokens"], stats["cached_tokens"]
    values = [f"topic {k}" if arg == "topic" else k for k in range(items)]
    t = time.perf_counter()
    states = program.run_batch([{arg: v} for v in values], backend=backend)
    wall = time.perf_counter() - t
    assert all(s.error() is None for s in states), [s.error() for s in states if s.error()][:1]
    return wall, (stats["cached_tokens"] - c0) / max(stats["prompt_tokens"] - p0, 1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--items", type=int, default=16)
    args = ap.parse_args()
    engine = Engine(progress=False)
    on = sgl.EngineBackend(engine)
    off = sgl.EngineBackend(Engine.from_model(engine.model, engine.tokenizer, disable_radix_cache=True))
    print(f"\n{args.items} programs per workload, bfloat16, in-process EngineBackend")
    print("| workload | radix on (s) | radix off (s) | speedup | cache hit rate |")
    print("|---|---|---|---|---|")
    for name, (program, arg) in WORKLOADS.items():
        run(program, arg, 2, on)  # warm-up
        t_on, hit = run(program, arg, args.items, on)
        t_off, _ = run(program, arg, args.items, off)
        print(f"| {name} | {t_on:.1f} | {t_off:.1f} | {t_off / t_on:.2f}x | {hit:.1%} |")


if __name__ == "__main__":
    main()
