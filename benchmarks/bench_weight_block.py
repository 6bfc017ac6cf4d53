"""The weights in one huge-page block (runtime/model/weight_arena.py) against the weights where the loader
left them: one decode forward at a fixed context, replayed, the variants alternating in one process.

    python benchmarks/bench_weight_block.py [--model FILE.gguf] [--batch 1 8] [--reps 12] [--out FILE.json]

The Engine's defaults (the fused decoder layers), its weight block turned off while it loads; then the same
weights are copied into a block and a second set of fused layers is built on them. Each repetition runs 40
forwards of the same ForwardBatch (the same KV slot rewritten, so the context stays put) per variant; the
logits must be equal bit for bit. Medians over the repetitions, and their ratio; and how long the move
into the block took (the start-up cost the runner pays).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import multiprocessing
import statistics
import time

from harness import cpu_description, save_result, text_of_tokens

FORWARDS = 40


def decode_batch(engine, batch: int):
    """A decode ForwardBatch of ``batch`` requests 300 tokens into their prompts (captured from a step)."""
    sched = engine.scheduler
    prompts = [text_of_tokens(engine.tokenizer, 300, seed=i) for i in range(batch)]
    engine.submit(engine.build(input_ids=prompts, sampling_params={"temperature": 0, "max_new_tokens": 64,
                                                                   "ignore_eos": True}))
    while sched.chunked or sched.waiting or len(sched.running) < batch:
        engine.core.step()
    executor = engine.core.executor
    seen, forward = [], executor.forward
    executor.forward = lambda b: seen.append(b) or forward(b)
    engine.core.step()
    executor.forward = forward
    return seen[-1]


def measure(model: str | None, batch: int, reps: int) -> dict:
    import torch

    from radixlm.runtime.engine import Engine
    from radixlm.runtime.model import runner as runner_module
    from radixlm.runtime.model.fused import FusedLayers
    from radixlm.runtime.model.weight_arena import move_to_arena, read_order

    runner_module.move_to_arena = lambda m: None  # load as before the block: the weights where the loader left them
    engine = Engine(model, progress=False, decode_steps=1)  # one forward a step, to capture
    r = engine.runner
    mods = read_order(engine.model)
    loaded = [m.quant for m in mods]
    fb = decode_batch(engine, batch)
    variants = {"as loaded": (loaded, r.fused)}
    start = time.perf_counter()
    arena = move_to_arena(engine.model)  # what the runner does at start
    move_s = time.perf_counter() - start
    variants["one block"] = ([m.quant for m in mods], FusedLayers(engine.model, r.pool.k_buffer,
                                                                  r.pool.v_buffer, r.fused.isa))
    ms, ref = {k: [] for k in variants}, None
    with torch.inference_mode():
        for _ in range(reps):
            for name, (quants, fused) in variants.items():
                for m, q in zip(mods, quants, strict=True):
                    m.quant = q
                r.fused = fused
                out = r.forward(fb)
                ref = out.clone() if ref is None else ref
                assert torch.equal(out, ref), "the variants' logits differ"
                start = time.perf_counter()
                for _ in range(FORWARDS):
                    r.forward(fb)
                ms[name].append((time.perf_counter() - start) / FORWARDS * 1e3)
    med = {k: statistics.median(v) for k, v in ms.items()}
    return {"batch": batch, "ms": med, "ms_all": ms, "ratio": med["as loaded"] / med["one block"],
            "block_mb": arena.nbytes / 1e6, "move_s": move_s, "huge_pages": arena.huge_pages, "model": model or "SmolLM2"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="a GGUF file (default: the embedded SmolLM2)")
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--reps", type=int, default=12)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    ctx = multiprocessing.get_context("spawn")
    results = []
    for b in args.batch:  # a fresh process each
        with concurrent.futures.ProcessPoolExecutor(1, mp_context=ctx) as pool:
            results.append(pool.submit(measure, args.model, b, args.reps).result())
    when = time.strftime("%Y-%m-%d %H:%M")
    print(f"\n{when}, {cpu_description()}, {results[0]['model']}, Engine defaults, a decode forward at a fixed "
          f"context, median of {args.reps} x {FORWARDS}")
    print("| batch | weights as loaded (ms) | in one block (ms) | as loaded / block | block MB, huge pages | "
          "the move at start (s) |")
    print("|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['batch']} | {r['ms']['as loaded']:.2f} | {r['ms']['one block']:.2f} | {r['ratio']:.2f}x | "
              f"{r['block_mb']:.1f}, {r['huge_pages']} | {r['move_s']:.2f} |")
    save_result(args.out, date=when, results=results)


if __name__ == "__main__":
    main()
