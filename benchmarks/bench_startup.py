"""Time from `radixlm serve` to a 200 from /health, and the same for llama.cpp's llama-server on the same file.

    python benchmarks/bench_startup.py [--repeats 3] [--llama-server PATH] [--out benchmarks/results/FILE.json]

Each start is a fresh process tree with warm files (the kernels built and the tokenizer cached, as on every
start after the first); the median of the repeats is reported, with the CPU. llama-server (if found,
default ../peers/llama-server) is the baseline measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from common import cpu_description, smollm_path, wait_healthy  # noqa: E402

PORT = 31555


def time_to_health(cmd: list[str]) -> float:
    """Seconds from the spawn of ``cmd`` to its first 200 on /health; the process tree is then stopped."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_healthy(proc, f"http://127.0.0.1:{PORT}", poll=0.05)
        return time.perf_counter() - start
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--llama-server", default=os.path.join(os.path.dirname(__file__), "..", "..", "peers",
                                                           "llama-server"))
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    model = smollm_path()
    systems = {"radixlm serve": [sys.executable, "-m", "radixlm.runtime", "serve", "--port", str(PORT)]}
    if os.path.exists(args.llama_server):
        systems["llama-server"] = [args.llama_server, "-m", model, "--port", str(PORT), "-t", str(os.cpu_count())]
    time_to_health(systems["radixlm serve"])  # the first start builds or loads what later starts reuse
    results = {name: [time_to_health(cmd) for _ in range(args.repeats)] for name, cmd in systems.items()}
    print(f"\n{time.strftime('%Y-%m-%d %H:%M')}, {cpu_description()}, SmolLM2-135M Q4_1, median of {args.repeats}")
    base = statistics.median(results.get("llama-server", [float("nan")]))
    for name, times in results.items():
        med = statistics.median(times)
        print(f"{name:14s} {med:6.2f} s to /health ({med / base:.2f}x llama-server)  runs: "
              + ", ".join(f"{t:.2f}" for t in times))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"date": time.strftime("%Y-%m-%d %H:%M"), "cpu": cpu_description(), "seconds": results}, f,
                      indent=2)


if __name__ == "__main__":
    main()
