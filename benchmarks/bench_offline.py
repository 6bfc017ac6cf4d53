"""Offline throughput: radixlm Engine vs transformers generate (one at a time, and padded batches).

    python benchmarks/bench_offline.py [--num-prompts 64] [--hf-sequential 8] [--dtype bfloat16]

Prints output tokens/s and mean latency of each, and ratios against the baselines measured in the same run.
"""

from __future__ import annotations

import argparse
import time

import torch
from harness import hf_model, text_of_tokens

from radixlm.kernels.cpu_info import core_budget
from radixlm.runtime.engine import Engine


def hf_sequential(model, prompts, out_len):
    lat = []
    with torch.no_grad():
        for ids in prompts:
            t = time.perf_counter()
            model.generate(torch.tensor([ids]), max_new_tokens=out_len, min_new_tokens=out_len, do_sample=False)
            lat.append(time.perf_counter() - t)
    return len(prompts) * out_len / sum(lat), sum(lat) / len(lat)


def hf_batched(model, prompts, out_len, batch):
    lat, total = [], 0.0
    with torch.no_grad():
        for i in range(0, len(prompts), batch):
            chunk = prompts[i:i + batch]
            n = max(map(len, chunk))
            ids = torch.tensor([[2] * (n - len(p)) + p for p in chunk])  # left padding
            mask = torch.tensor([[0] * (n - len(p)) + [1] * len(p) for p in chunk])
            t = time.perf_counter()
            model.generate(ids, attention_mask=mask, max_new_tokens=out_len, min_new_tokens=out_len,
                           do_sample=False, pad_token_id=2)
            dt = time.perf_counter() - t
            total += dt
            lat += [dt] * len(chunk)
    return len(prompts) * out_len / total, sum(lat) / len(lat)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--num-prompts", type=int, default=64)
    ap.add_argument("--input-len", type=int, default=200)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--hf-sequential", type=int, default=8, help="prompts for the slow one-at-a-time baseline")
    ap.add_argument("--hf-batch", type=int, default=8)
    ap.add_argument("--dtype", default="bfloat16")
    args = ap.parse_args()
    dtype = getattr(torch, args.dtype)
    torch.set_num_threads(core_budget())
    engine = Engine(dtype=args.dtype)
    prompts = [text_of_tokens(engine.tokenizer, args.input_len, seed=i) for i in range(args.num_prompts)]
    sp = {"temperature": 0, "max_new_tokens": args.output_len, "ignore_eos": True}
    engine.generate(input_ids=prompts[:2], sampling_params={**sp, "max_new_tokens": 2})  # warm-up
    engine.flush_cache()
    t = time.perf_counter()
    res = engine.generate(input_ids=prompts, sampling_params=sp)
    wall = time.perf_counter() - t
    ours = (args.num_prompts * args.output_len / wall, sum(r["meta_info"]["e2e_latency"] for r in res) / len(res))
    model = hf_model(engine.model_path if hasattr(engine, "model_path") else _default_path(), dtype)
    seq = hf_sequential(model, prompts[: args.hf_sequential], args.output_len)
    bat = hf_batched(model, prompts, args.output_len, args.hf_batch)
    print(f"\n{args.num_prompts} prompts x {args.input_len} in / {args.output_len} out, {args.dtype}, "
          f"{torch.get_num_threads()} threads")
    print("| system | output tok/s | mean latency (s) | radixlm speedup |")
    print("|---|---|---|---|")
    for name, (tps, lat) in [("radixlm Engine", ours), (f"HF generate, one at a time ({args.hf_sequential} prompts)", seq),
                             (f"HF generate, padded batches of {args.hf_batch}", bat)]:
        print(f"| {name} | {tps:.1f} | {lat:.2f} | {ours[0] / tps:.2f}x |")


def _default_path() -> str:
    from radixlm.runtime.model.sources import default_model_path

    return default_model_path()


if __name__ == "__main__":
    main()
