"""Where a decode step's time goes: the forward pass (decoder layers, LM head, the rest) against the
scheduler's own CPU work around it (scheduling and KV slots, the batch tensors, sampling, stop checks).

    python benchmarks/bench_step_overhead.py [--batch 1 8] [--steps 128] [--decode-steps 1] [--phases] [--out FILE.json]

The Engine's defaults on the embedded SmolLM2, greedy, ``ignore_eos``; each batch size in a process of its
own. The parts are timed by wrapping the functions the scheduler calls on this engine's objects (nothing in
the package is changed); ``step`` is the whole ``Scheduler.step``, so ``step - forward`` is the scheduler's
share, the CPU work that a forward pass on another core could hide. ``--phases``: the fused layers' own profile
too, each thread's work and wait at the barrier per phase of a layer, summed over the layers (µs a step).
``--decode-steps N``: the engine's groups of N steps (1, the default here, is one token a step, as requests under
a grammar decode); the figures are then per token, and a group's call (its embedding
lookups, layers, LM heads and argmaxes) counts as the forward and the layers.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import functools
import multiprocessing
import time
from collections import defaultdict

from harness import cpu_description, save_result, text_of_tokens

PARTS = ("step", "forward", "layers", "lm_head", "schedule", "batch", "sample", "append")


def _wrap(owner, name: str, key: str, totals: dict) -> None:
    """Replace owner.name by a wrapper that adds its wall time to totals[key]."""
    fn = getattr(owner, name)

    @functools.wraps(fn)
    def timed(*args, **kwargs):
        t = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            totals[key] += time.perf_counter() - t

    setattr(owner, name, timed)


def measure(batch: int, steps: int, prompt_len: int, phases: bool = False, decode_steps: int = 1) -> dict:
    import torch

    from radixlm.runtime.engine import Engine
    from radixlm.runtime.execute import executor as executor_module
    from radixlm.runtime.scheduler import postprocess as postprocess_module

    engine = Engine(progress=False, decode_steps=decode_steps, decode_group_ms=0)  # groups of decode_steps, always
    sched, core, totals = engine.scheduler, engine.core, defaultdict(float)
    _wrap(core, "step", "step", totals)
    _wrap(core.executor, "forward", "forward", totals)  # the runner's forward, as the executor calls it
    _wrap(core.executor, "fused_steps", "forward", totals)  # a group of steps in one call
    _wrap(sched, "schedule", "schedule", totals)
    _wrap(executor_module, "make_decode_batch", "batch", totals)
    _wrap(executor_module, "sample", "sample", totals)
    _wrap(postprocess_module, "append_token", "append", totals)
    _wrap(engine.model.lm_head, "logits", "lm_head", totals)
    fused = engine.runner.fused
    if fused is not None:  # a ScriptObject's method cannot be replaced: time it through a proxy
        layers = fused.layers
        proxy = argparse.Namespace(run=layers.run, decode_steps=layers.decode_steps, set_profiling=layers.set_profiling,
                                   phase_profile=layers.phase_profile)
        _wrap(proxy, "run", "layers", totals)
        _wrap(proxy, "decode_steps", "layers", totals)
        fused.layers = proxy
    # the LM head inside the fused call is timed by the call's own profile (its last phase)
    profiling = fused is not None and (phases or fused.head_fused)
    prompts = [text_of_tokens(engine.tokenizer, prompt_len, seed=i) for i in range(batch)]
    params = {"temperature": 0, "max_new_tokens": steps + 8 * decode_steps + 16, "ignore_eos": True}
    engine.submit(engine.build(input_ids=prompts, sampling_params=params))
    while sched.chunked or sched.waiting or len(sched.running) < batch:  # prefill, not measured
        core.step()
    for _ in range(8):  # warm-up decode steps
        core.step()
    totals.clear()
    if profiling:
        fused.profile_phases(True)
    start, tokens = time.perf_counter(), 0
    while tokens < steps * batch and sched.running:  # steps: tokens a request
        tokens += sum(len(out.new_tokens) for out in core.step())
    steps = tokens // batch
    wall = time.perf_counter() - start
    profile = fused.phase_profile() / steps if profiling else None
    ms = {k: totals[k] / steps * 1e3 for k in PARTS}
    if profiling and fused.head_fused:
        ms["lm_head"] = float(profile[0, 0, -1]) / 1e3
        ms["layers"] -= ms["lm_head"]
    ms["other_forward"] = ms["forward"] - ms["layers"] - ms["lm_head"]
    ms["scheduler"] = ms["step"] - ms["forward"]
    return {"batch": batch, "steps": steps, "tok_s": batch * steps / wall, "ms_per_step": ms,
            "scheduler_share": ms["scheduler"] / ms["step"], "decode_steps": decode_steps, "threads": torch.get_num_threads(),
            "kernels": fused is not None, "phases": phase_table(profile) if phases else None}


def phase_table(profile) -> dict | None:
    """[threads, 2, phases] µs a step -> {phase: {"work": [per thread], "wait": [per thread]}}."""
    from radixlm.runtime.model.fused import PHASES

    if profile is None:
        return None
    return {name: {"work": profile[:, 0, i].tolist(), "wait": profile[:, 1, i].tolist()}
            for i, name in enumerate(PHASES)}


def print_phases(r: dict) -> None:
    print(f"\nbatch {r['batch']}, the fused layers' phases, µs a step summed over the layers (work / wait at the "
          "barrier after it, per thread)")
    print("| phase | " + " | ".join(f"thread {t}" for t in range(r["threads"])) + " |")
    print("|---|" + "---|" * r["threads"])
    for name, p in r["phases"].items():
        cells = [f"{w:.0f} / {v:.0f}" for w, v in zip(p["work"], p["wait"], strict=True)]
        print(f"| {name} | " + " | ".join(cells) + " |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--steps", type=int, default=128)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--decode-steps", type=int, default=1, help="decode steps back to back (the engine's default is 4)")
    ap.add_argument("--phases", action="store_true", help="the fused layers' time per phase and thread too")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    results = []
    ctx = multiprocessing.get_context("spawn")
    for b in args.batch:  # a fresh process each: no state carried between batch sizes
        with concurrent.futures.ProcessPoolExecutor(1, mp_context=ctx) as pool:
            results.append(pool.submit(measure, b, args.steps, args.prompt_len, args.phases,
                                       args.decode_steps).result())
    print(f"\n{time.strftime('%Y-%m-%d %H:%M')}, {cpu_description()}, SmolLM2-135M Engine defaults, "
          f"{args.steps} decode steps after a {args.prompt_len}-token prompt, decode_steps {args.decode_steps} "
          "(ms a token)")
    print("| batch | tok/s | step ms | forward ms (layers / LM head / rest) | scheduler ms (schedule / batch / "
          "sample / append / rest) | scheduler share |")
    print("|---|---|---|---|---|---|")
    for r in results:
        m = r["ms_per_step"]
        rest = m["scheduler"] - m["schedule"] - m["batch"] - m["sample"] - m["append"]
        print(f"| {r['batch']} | {r['tok_s']:.1f} | {m['step']:.2f} | {m['forward']:.2f} ({m['layers']:.2f} / "
              f"{m['lm_head']:.2f} / {m['other_forward']:.2f}) | {m['scheduler']:.3f} ({m['schedule']:.3f} / "
              f"{m['batch']:.3f} / {m['sample']:.3f} / {m['append']:.3f} / {rest:.3f}) | "
              f"{r['scheduler_share']:.1%} |")
    for r in results:
        if r["phases"] is not None:
            print_phases(r)
    save_result(args.out, results=results)


if __name__ == "__main__":
    main()
