"""Scaling past the 135M model, radixlm against llama.cpp on the same random-weight GGUF files (make_gguf.py).

    python benchmarks/make_gguf.py --sizes 0.5b 1.5b --types Q4_0
    python benchmarks/bench_scaling.py --models ../models/random-0.5b-Q4_0.gguf ../models/random-1.5b-Q4_0.gguf \
        [--llama-bench ../peers/llama-bench] [--sweeps ../models/random-0.5b-Q4_0.gguf] [--out FILE.json]

For every model: batch-1 decode (tok/s, and as a fraction of the machine's read-bandwidth ceiling: the bytes a
step reads / machine_limits' measured read bandwidth) and prefill of a 512-token prompt, radixlm's in-process
Engine (its defaults) against llama-bench's tg64 and pp512 (2 threads). The machine's speed drifts within
minutes, so decode runs in ROUNDS rounds of (bandwidth, radixlm, llama.cpp, bandwidth): each round's fractions
are against the bandwidth measured around it, and the medians over rounds are reported. For the --sweeps models also:
output throughput against concurrency (1 to 64 requests at once, 64 tokens each) and TTFT / TPOT against
context length (512 to 8,192), with llama-bench's pp and tg at the same depths for the latter.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import time

from harness import cpu_description, decode_tok_s
from machine_limits import read_bandwidth

from radixlm.kernels.cpu_info import core_budget
from radixlm.runtime.engine import Engine
from radixlm.runtime.model.sources import resolve_model
from radixlm.runtime.model.weight_arena import weight_tensors

CONCURRENCY = (1, 2, 4, 8, 16, 32, 64)
CONTEXTS = (512, 1024, 2048, 4096, 8192)
ROUNDS = 3


def prompt_ids(n: int, seed: int = 0) -> list[int]:
    return [(7 * i + 13 * seed) % 40000 + 100 for i in range(n)]  # any ids: the weights are random


def decode_rate(engine: Engine, batch: int, new_tokens: int, prompt_len: int = 64) -> float:
    prompts = [prompt_ids(prompt_len, s) for s in range(batch)]
    return decode_tok_s(engine, prompts, {"temperature": 0, "max_new_tokens": new_tokens})[0]


def prefill_tok_s(engine: Engine, n: int, repeats: int = 3) -> float:
    """The mean rate of ``repeats`` cold prefills of an n-token prompt, as llama-bench's avg_ts over its
    repeats (a single run moved by 40% with the machine)."""
    ids, rates = prompt_ids(n, seed=99), []
    for _ in range(repeats):
        t = time.perf_counter()
        engine.generate(input_ids=ids, sampling_params={"temperature": 0, "max_new_tokens": 1})
        rates.append(n / (time.perf_counter() - t))
        engine.flush_cache()
    return statistics.mean(rates)


def ttft_tpot(engine: Engine, context: int, new_tokens: int = 32) -> tuple[float, float]:
    res = engine.generate(input_ids=prompt_ids(context - new_tokens, seed=context),
                          sampling_params={"temperature": 0, "ignore_eos": True, "max_new_tokens": new_tokens})
    meta = res["meta_info"]
    engine.flush_cache()
    return meta["ttft"], (meta["e2e_latency"] - meta["ttft"]) / (new_tokens - 1)


def step_bytes(engine: Engine) -> int:
    """Bytes of weights a batch-1 decode step reads: every layer's and the LM head's, as the engine holds them
    (the embedding lookup reads one row of a tied table; norms are negligible)."""
    total = 0
    for module in [*engine.model.layers.modules(), engine.model.lm_head]:
        quant = getattr(module, "quant", None)
        if quant is not None:
            total += sum(t.numel() * t.element_size() for t in weight_tensors(quant))
        elif getattr(module, "weight", None) is not None and module.weight.dim() == 2:
            total += module.weight.numel() * module.weight.element_size()
    return total


def llama_bench(exe: str, model: str, args: list[str], repeats: int = 3) -> list[dict]:
    out = subprocess.run([exe, "-m", model, "-t", str(core_budget()), "-r", str(repeats), "-o", "json", *args],
                         capture_output=True, text=True, timeout=3600)
    return json.loads(out.stdout) if out.returncode == 0 else []


def llama_rate(rows: list[dict], key: str) -> float | None:
    return next((r["avg_ts"] for r in rows if r.get(key)), None)


def llama_at_depth(exe: str, model: str, context: int, new_tokens: int = 32) -> tuple[float | None, float | None]:
    """llama-bench's prefill of context - new_tokens tokens, and its decode at that depth (tok/s)."""
    prefill = llama_rate(llama_bench(exe, model, ["-p", str(context - new_tokens), "-n", "0"], 1), "n_prompt")
    decode = llama_rate(llama_bench(exe, model, ["-p", "0", "-n", str(new_tokens), "-d", str(context - new_tokens)], 1),
                        "n_gen")
    return prefill, decode


def summary_row(r: dict) -> str:
    ours, theirs = r["radixlm_decode"], r.get("llama_decode")
    cells = [r["model"], f"{ours:.1f} ({r['radixlm_fraction']:.0%})", "-", "-", f"{r['radixlm_prefill_512']:.0f}",
             f"{r['llama_prefill_512']:.0f}" if r.get("llama_prefill_512") else "-"]
    if theirs:
        cells[2] = f"{theirs:.1f} ({r['llama_fraction']:.0%})"
        cells[3] = f"{r['ratio']:.2f}x"
    return "| " + " | ".join(cells) + " |"


def decode_rounds(engine: Engine, exe: str | None, model: str, bytes_per_token: int) -> dict:
    """ROUNDS rounds of (bandwidth, radixlm decode, llama.cpp decode, bandwidth) -> per-round rates and
    fractions of the ceiling measured around them, and their medians."""
    rounds = []
    for _ in range(ROUNDS):
        before = read_bandwidth(1024, 3)
        r = {"radixlm_decode": decode_rate(engine, 1, 64)}
        if exe:
            r["llama_decode"] = llama_rate(llama_bench(exe, model, ["-p", "0", "-n", "64"], 1), "n_gen")
        r["bandwidth"] = (before + read_bandwidth(1024, 3)) / 2
        r["radixlm_fraction"] = r["radixlm_decode"] * bytes_per_token / r["bandwidth"]
        if r.get("llama_decode"):
            r["llama_fraction"] = r["llama_decode"] * os.path.getsize(model) / r["bandwidth"]
            r["ratio"] = r["radixlm_decode"] / r["llama_decode"]
        rounds.append(r)
    out = {"rounds": rounds}
    for key in ("radixlm_decode", "llama_decode", "bandwidth", "radixlm_fraction", "llama_fraction", "ratio"):
        values = [r[key] for r in rounds if r.get(key)]
        if values:
            out[key] = statistics.median(values)
    return out


def run_model(model: str, exe: str | None, sweeps: bool) -> dict:
    t = time.perf_counter()
    engine = Engine(model, progress=False, max_total_tokens=16384, chunked_prefill_size=2048)
    out = {"model": os.path.basename(model), "startup_s": time.perf_counter() - t}
    out["bytes_per_token"] = step_bytes(engine)
    decode_rate(engine, 1, 16)  # warm-up
    out.update(decode_rounds(engine, exe, model, out["bytes_per_token"]))
    out["radixlm_prefill_512"] = prefill_tok_s(engine, 512)
    if exe:
        out["llama_prefill_512"] = llama_rate(llama_bench(exe, model, ["-p", "512", "-n", "0"]), "n_prompt")
        out["llama_bytes_per_token"] = os.path.getsize(model)
    out["ceiling"] = out["bandwidth"] / out["bytes_per_token"]
    print(f"{out['model']}: radixlm decode {out['radixlm_decode']:.1f} tok/s ({out['radixlm_fraction']:.0%} of the "
          f"ceiling), prefill {out['radixlm_prefill_512']:.0f} tok/s; llama.cpp decode {out.get('llama_decode')} "
          f"({out.get('llama_fraction')}), pp512 {out.get('llama_prefill_512')}; rounds {out['rounds']}", flush=True)
    if sweeps:
        out["concurrency"] = {c: decode_rate(engine, c, 64) for c in CONCURRENCY}
        print("  throughput by concurrency:", {c: round(v, 1) for c, v in out["concurrency"].items()}, flush=True)
        out["context"] = {c: ttft_tpot(engine, c) for c in CONTEXTS}
        print("  TTFT s / TPOT ms by context:", {c: (round(a, 2), round(b * 1e3, 1)) for c, (a, b) in
                                               out["context"].items()}, flush=True)
        if exe:
            out["llama_context"] = {c: llama_at_depth(exe, model, c) for c in CONTEXTS}
            print("  llama.cpp pp / tg tok/s by context:", out["llama_context"], flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", required=True)
    ap.add_argument("--sweeps", nargs="*", default=[], help="models to sweep concurrency and context on")
    ap.add_argument("--llama-bench", default=os.path.join(os.path.dirname(__file__), "..", "..", "peers", "llama-bench"))
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    exe = args.llama_bench if os.path.exists(args.llama_bench) else None
    header = f"{time.strftime('%Y-%m-%d %H:%M')}, {cpu_description()}"
    print(header, flush=True)
    paths = {m: resolve_model(m).path for m in args.models}  # files or catalog names (radixlm models list)
    results = [run_model(paths[m], exe, m in args.sweeps) for m in args.models]
    print("\n| model | radixlm decode tok/s (of ceiling) | llama.cpp decode tok/s (of ceiling) | radixlm / llama.cpp | "
          "radixlm prefill tok/s | llama.cpp pp512 |")
    print("|---|---|---|---|---|---|")
    for r in results:
        print(summary_row(r))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"header": header, "rounds": ROUNDS, "results": results}, f, indent=2)


if __name__ == "__main__":
    main()
