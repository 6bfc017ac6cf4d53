"""Constrained decoding costs, measured in one run (offline Engine, the embedded SmolLM2, the Engine's defaults).

    python benchmarks/bench_constrained.py

1. Time per output token with a JSON schema vs unconstrained, at batch 1 and 32 (ignore_eos is not
   possible under a grammar, so both sides generate until a fixed schema is complete: tokens are counted).
2. Mask fill and apply time per constrained row and step, per backend (the apply on the engine's kernel path).
3. JSON extraction with and without jump-forward: wall time and decode steps.
4. Compile time per schema and the grammar cache hit rate.
"""

from __future__ import annotations

import json
import time

import torch
from harness import cpu_description

from radixlm.constrained import ConstraintSpec, GrammarCache, make_backend
from radixlm.kernels.token_bitmask import apply_token_bitmask
from radixlm.runtime.engine import Engine

SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 16}, "city": {"type": "string", "maxLength": 16},
    "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "skills": {"type": "array", "maxItems": 3, "items": {"type": "string", "maxLength": 12}}},
    "required": ["name", "city", "age", "skills"]}
DOC = ("Maria Lopez is a 34 year old engineer from Valencia. She knows Python, welding and Spanish. "
       "Her colleague Tom Berg, 51, lives in Oslo and knows sailing.")


def tpot(engine: Engine, batch: int, constrained: bool, length: int = 80) -> tuple[float, int]:
    """Seconds per output token and tokens per request. A grammar ends its request (EOS) when the JSON is
    complete, so the unconstrained run is given the same length, with ignore_eos, to compare like for like."""
    prompts = [f"Extract a person from: {DOC} (variant {i})\nJSON:" for i in range(batch)]
    sp = {"temperature": 0, "max_new_tokens": length}
    if constrained:
        sp["json_schema"] = json.dumps(SCHEMA)
    else:
        sp["ignore_eos"] = True
    engine.generate(prompts, sp)  # warm the cache and the grammar
    t = time.perf_counter()
    out = engine.generate(prompts, sp)
    wall = time.perf_counter() - t
    per_request = sum(len(o["output_ids"]) for o in out) / batch
    return wall / max(per_request, 1), round(per_request)


def mask_costs(tokenizer, isa: int | None) -> dict[str, tuple[float, float]]:
    """Per backend: (mask fill, mask apply) µs per token of one row, the apply on the engine's kernel path."""
    out = {}
    doc_ids = tokenizer(json.dumps({"name": "Maria Lopez", "city": "Valencia", "age": 34,
                                    "skills": ["Python", "welding"]}), add_special_tokens=False)["input_ids"]
    for name in ("xgrammar", "outlines"):
        backend = make_backend(name, tokenizer, 49152, [2])
        schema = {**SCHEMA, "properties": {**SCHEMA["properties"], "age": {"type": "integer"}}}
        matcher = backend.compile(ConstraintSpec.json_schema(schema)).matcher()
        bitmask = torch.full((1, 1536), -1, dtype=torch.int32)
        logits = torch.randn(1, 49152)
        fill = apply = 0.0
        for tok in doc_ids:
            t = time.perf_counter()
            matcher.fill_bitmask(bitmask, 0)
            t2 = time.perf_counter()
            apply_token_bitmask(logits, bitmask, torch.tensor([0]), isa)
            apply += time.perf_counter() - t2
            fill += t2 - t
            matcher.accept_token(tok)
        out[name] = (fill / len(doc_ids) * 1e6, apply / len(doc_ids) * 1e6)
    return out


def jump_forward(engine_on: Engine, engine_off: Engine) -> dict[str, tuple[float, int]]:
    res = {}
    prompts = [f"Extract a person from: {DOC} ({i})\nJSON:" for i in range(8)]
    sp = {"temperature": 0, "max_new_tokens": 80, "json_schema": json.dumps(SCHEMA)}
    for label, eng in (("off", engine_off), ("on", engine_on)):
        eng.generate(prompts[:1], sp)
        steps = eng.scheduler.stats["decode_steps"] + eng.scheduler.stats["prefill_steps"]
        t = time.perf_counter()
        eng.generate(prompts, sp)
        res[label] = (time.perf_counter() - t,
                      eng.scheduler.stats["decode_steps"] + eng.scheduler.stats["prefill_steps"] - steps)
    return res


def compile_costs(tokenizer) -> list[str]:
    lines = []
    for name in ("xgrammar", "outlines"):
        cache = GrammarCache(make_backend(name, tokenizer, 49152, [2]))
        specs = [ConstraintSpec.json_schema({"type": "object", "properties": {f"field_{k}": {"type": "string",
                                                                                              "maxLength": 8}
                                                                               for k in range(n)}})
                 for n in range(1, 9)]
        t = time.perf_counter()
        for spec in specs:
            cache.compile_now(spec)
        first = (time.perf_counter() - t) / len(specs) * 1e3
        for _ in range(3):
            for spec in specs:
                cache.compile_now(spec)
        lines.append(f"| {name} | {first:.1f} ms | {cache.hits / (cache.hits + cache.misses):.0%} |")
        cache.shutdown()
    return lines


def main() -> None:
    engine = Engine(max_running_requests=64)
    off = Engine.from_model(engine.model, engine.tokenizer, jump_forward=False, max_running_requests=64)
    print(f"\n{time.strftime('%Y-%m-%d %H:%M')}, {cpu_description()}, SmolLM2-135M Engine defaults, greedy")
    print("\n| batch | unconstrained s/token | JSON schema s/token | overhead |")
    print("|---|---|---|---|")
    for batch in (1, 32):
        schema, length = tpot(off, batch, True)
        free, _ = tpot(off, batch, False, length)
        print(f"| {batch} | {free * 1e3:.1f} ms | {schema * 1e3:.1f} ms | {schema / free - 1:+.1%} |")
    print(f"\n| backend | mask fill per token (one row) | mask apply (kernel path {engine.runner.cpu_isa}) |")
    print("|---|---|---|")
    for name, (fill, apply) in mask_costs(engine.tokenizer, engine.runner.cpu_isa).items():
        print(f"| {name} | {fill:.0f} µs | {apply:.0f} µs |")
    jf = jump_forward(engine, off)
    print("\n| JSON extraction, 8 requests | wall (s) | forward steps |")
    print("|---|---|---|")
    for label in ("off", "on"):
        print(f"| jump-forward {label} | {jf[label][0]:.2f} | {jf[label][1]} |")
    print(f"speedup from jump-forward: {jf['off'][0] / jf['on'][0]:.2f}x")
    print("\n| backend | compile, mean of 8 schemas (cold) | cache hit rate over 4 passes |")
    print("|---|---|---|")
    print("\n".join(compile_costs(engine.tokenizer)))


if __name__ == "__main__":
    main()
