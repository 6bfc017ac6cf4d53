"""Time from `radixlm serve` to a 200 from /health, and the same for llama.cpp's llama-server on the same file;
then the latency of the first requests: a short chat completion sent the moment /health answers, and after
IDLE_S with nothing to do a JSON-schema-constrained one (the first that needs the grammar backend); the resident
memory of the server's processes after them (the sum of their PSS); then the time a SIGTERM takes to stop the
idle server (its process exits).

    python benchmarks/bench_startup.py [--model FILE_OR_NAME] [--context 8192] [--repeats 3]
        [--llama-server PATH] [--out benchmarks/results/startup/FILE.json]

--context N serves N tokens of context on both: llama-server's -c N, radixlm's --context-length N (which sizes its
KV pool to N tokens, as -c does llama-server's), so their memory holds the same KV.

Each start is a fresh process tree with warm files (the kernels built and the tokenizer cached, as on every
start after the first); the median of the repeats is reported, with the CPU. llama-server (if found,
default ../peers/llama-server) is the baseline measured in the same run.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import time

import httpx
from harness import cpu_description, save_result, smollm_path, wait_healthy

from radixlm.kernels.cpu_info import core_budget
from radixlm.runtime.model.sources import resolve_model

PORT = 31555


IDLE_S = 3.0
SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"]}


def timed_chat(url: str, content: str, **extra) -> float:
    """Seconds for one greedy chat completion (a failed request counts as nan)."""
    body = {"model": "default", "messages": [{"role": "user", "content": content}], "max_tokens": 16,
            "temperature": 0, **extra}
    start = time.perf_counter()
    ok = httpx.post(url + "/v1/chat/completions", json=body, timeout=120).status_code == 200
    return time.perf_counter() - start if ok else float("nan")


def tree_pss_mb(pid: int) -> float:
    """The memory of ``pid`` and its descendants, MB: the sum of their proportional set sizes (/proc's
    smaps_rollup), so pages two processes share (a mapped model file, torch's libraries) count once."""
    def children(p: int) -> list[int]:
        try:
            with open(f"/proc/{p}/task/{p}/children") as f:
                return [int(c) for c in f.read().split()]
        except OSError:
            return []

    total_kb, todo = 0, [pid]
    while todo:
        p = todo.pop()
        todo += children(p)
        try:
            with open(f"/proc/{p}/smaps_rollup") as f:
                total_kb += next(int(line.split()[1]) for line in f if line.startswith("Pss:"))
        except (OSError, StopIteration):
            pass
    return total_kb / 1e3


def start_and_probe(cmd: list[str]) -> dict[str, float]:
    """Seconds from the spawn of ``cmd`` to its first 200 on /health, the first requests' latencies, then the
    seconds from SIGTERM to the exit of the process it started (idle by then)."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{PORT}"
    try:
        wait_healthy(proc, url, poll=0.05)
        out = {"health": time.perf_counter() - start, "first_request": timed_chat(url, "Say hi")}
        time.sleep(IDLE_S)
        schema = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA}}
        out["first_json_after_idle"] = timed_chat(url, "A person as JSON", response_format=schema)
        out["memory_mb"] = tree_pss_mb(proc.pid)
        stop = time.perf_counter()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        out["stop"] = time.perf_counter() - stop
        return out
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--llama-server", default=os.path.join(os.path.dirname(__file__), "..", "..", "peers",
                                                           "llama-server"))
    ap.add_argument("--model", default=None, help="a GGUF file or a catalog name (default: the embedded SmolLM2)")
    ap.add_argument("--context", type=int, default=None, help="tokens of context (and KV) both servers hold")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    model = resolve_model(args.model).path if args.model else smollm_path()
    ours = ["--model", model] + (["--context-length", str(args.context)] if args.context else [])
    systems = {"radixlm serve": [sys.executable, "-m", "radixlm.runtime", "serve", "--port", str(PORT), *ours]}
    if os.path.exists(args.llama_server):
        systems["llama-server"] = [args.llama_server, "-m", model, "--port", str(PORT), "-t", str(core_budget()),
                                   *(["-c", str(args.context)] if args.context else [])]
    start_and_probe(systems["radixlm serve"])  # the first start builds or loads what later starts reuse
    results = {name: [start_and_probe(cmd) for _ in range(args.repeats)] for name, cmd in systems.items()}
    print(f"\n{time.strftime('%Y-%m-%d %H:%M')}, {cpu_description()}, {os.path.basename(model)}, context "
          f"{args.context or 'each default'}, median of {args.repeats}")
    peer = results.get("llama-server")
    base = statistics.median(r["health"] for r in peer) if peer else None
    for name, runs in results.items():
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        ratio = f" ({med['health'] / base:.2f}x llama-server)" if base else ""
        print(f"{name:14s} {med['health']:6.2f} s to /health{ratio}, "
              f"first request {med['first_request'] * 1000:.0f} ms, first JSON-schema request after {IDLE_S:.0f} s "
              f"idle {med['first_json_after_idle'] * 1000:.0f} ms, memory (PSS) {med['memory_mb']:.0f} MB, stop "
              f"{med['stop']:.2f} s;  runs to /health: "
              + ", ".join(f"{r['health']:.2f}" for r in runs))
    save_result(args.out, model=os.path.basename(model), context=args.context, seconds=results)


if __name__ == "__main__":
    main()
