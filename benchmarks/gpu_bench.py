"""GPU throughput of a random-weight Llama with Llama-3-8B shapes (weights made on the device, no download).

    python benchmarks/gpu_bench.py --out gpu_results/gpu_bench.json [--backends triton flashinfer]
    python benchmarks/gpu_bench.py --smoke      # tiny shapes on the CPU: checks the script itself

Decode tokens/s at batch 1, 8, 64 and 256 (ignore_eos, fixed lengths) and prefill tokens/s for 2,048-token
prompts, each with its fraction of the roofline: decode against HBM bandwidth (weights + KV read per step),
prefill against the bf16 matmul peak (2 * params FLOPs per token).
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from radixlm.runtime.config import ModelConfig
from radixlm.runtime.engine import Engine
from radixlm.runtime.model.loader import random_model

LLAMA3_8B = ModelConfig(architecture="LlamaForCausalLM", vocab_size=128256, hidden_size=4096,
                        intermediate_size=14336, num_layers=32, num_heads=32, num_kv_heads=8, head_dim=128,
                        rms_norm_eps=1e-5, rope_theta=500000.0, max_position_embeddings=8192)
SMOKE = ModelConfig(architecture="LlamaForCausalLM", vocab_size=512, hidden_size=128, intermediate_size=256,
                    num_layers=2, num_heads=2, num_kv_heads=1, head_dim=64, max_position_embeddings=4096)
H200 = {"hbm_bytes_s": 4.8e12, "bf16_flops": 989e12}


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def decode_run(engine: Engine, batch: int, in_len: int, out_len: int, device: str) -> float:
    """Decode tokens/s: B requests prefilled together, then timed from the first token to the last."""
    gen = torch.Generator().manual_seed(batch)
    prompts = torch.randint(0, engine.model.cfg.vocab_size, (batch, in_len), generator=gen).tolist()
    sp = {"temperature": 0, "max_new_tokens": out_len, "ignore_eos": True}
    res = engine.generate(input_ids=prompts, sampling_params=sp)
    first = max(r["meta_info"]["ttft"] for r in res)
    last = max(r["meta_info"]["e2e_latency"] for r in res)
    return batch * (out_len - 1) / (last - first)


def prefill_run(engine: Engine, n: int, length: int, device: str) -> float:
    gen = torch.Generator().manual_seed(7)
    prompts = torch.randint(0, engine.model.cfg.vocab_size, (n, length), generator=gen).tolist()
    engine.flush_cache()
    sync(device)
    t = time.perf_counter()
    engine.generate(input_ids=prompts, sampling_params={"max_new_tokens": 1, "temperature": 0})
    sync(device)
    return n * length / (time.perf_counter() - t)


def roofline_decode(cfg: ModelConfig, params: int, batch: int, ctx: int, dtype_bytes: int) -> float:
    """tokens/s if every step only read the weights and the batch's KV at HBM bandwidth."""
    kv = batch * ctx * cfg.num_layers * 2 * cfg.num_kv_heads * cfg.head_dim * dtype_bytes
    return batch / ((params * dtype_bytes + kv) / H200["hbm_bytes_s"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backends", nargs="+", default=["triton", "flashinfer"])
    ap.add_argument("--batches", nargs="+", type=int, default=[1, 8, 64, 256])
    ap.add_argument("--in-len", type=int, default=128)
    ap.add_argument("--out-len", type=int, default=64)
    ap.add_argument("--prefill-len", type=int, default=2048)
    ap.add_argument("--smoke", action="store_true", help="tiny model on the CPU (torch backend)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    device = "cpu" if args.smoke else "cuda"
    cfg = SMOKE if args.smoke else LLAMA3_8B
    backends = ["torch"] if args.smoke else args.backends
    batches = [1, 4] if args.smoke else args.batches
    model = random_model(cfg, torch.bfloat16, device=device)
    params = sum(p.numel() for p in model.parameters())
    results = {"model": "random Llama-3-8B shapes" if not args.smoke else "smoke", "params": params,
               "device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "runs": []}
    for backend in backends:
        try:
            engine = Engine.from_model(model, attention_backend=backend, max_running_requests=max(batches),
                                       max_total_tokens=max(batches) * (args.in_len + args.out_len) + 4 * args.prefill_len,
                                       chunked_prefill_size=8192, max_prefill_tokens=16384)
        except (ImportError, ValueError) as e:
            results["runs"].append({"backend": backend, "error": f"{type(e).__name__}: {e}"})
            print(f"{backend}: not run ({e})")
            continue
        decode_run(engine, batches[0], args.in_len, 8, device)  # warm-up (Triton compiles)
        for b in batches:
            tok_s = decode_run(engine, b, args.in_len, args.out_len, device)
            ceiling = roofline_decode(cfg, params, b, args.in_len + args.out_len // 2, 2)
            results["runs"].append({"backend": backend, "kind": "decode", "batch": b, "tok_s": tok_s,
                                    "roofline_tok_s": ceiling, "fraction": tok_s / ceiling})
            print(f"{backend} decode batch {b}: {tok_s:.1f} tok/s, {100 * tok_s / ceiling:.1f}% of the HBM roofline")
        tok_s = prefill_run(engine, 4, args.prefill_len, device)
        peak = H200["bf16_flops"] / (2 * params)
        results["runs"].append({"backend": backend, "kind": "prefill", "length": args.prefill_len, "tok_s": tok_s,
                                "peak_tok_s": peak, "fraction": tok_s / peak})
        print(f"{backend} prefill {args.prefill_len}: {tok_s:.0f} tok/s, {100 * tok_s / peak:.1f}% of bf16 peak")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
