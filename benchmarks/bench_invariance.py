"""What batch- and cache-invariance costs: `radixlm serve` as it starts (invariant) against the fastest
non-invariant setting, on run_peers' workloads A-E, in one run (one server at a time: 2 cores).

    python benchmarks/bench_invariance.py [--workloads A B C D E] [--flags "--quantization none"]
                                          [--out benchmarks/results/invariance/DATE.json]

Settings: invariant = the defaults; compiled = --no-deterministic --enable-torch-compile (the decode step
through torch.compile); torch = --no-deterministic --cpu-kernels torch (torch's matmuls and SDPA, which
pick their blocking by shape); torch-compiled = both. Prints per workload each setting's output tok/s and
invariant / the fastest of the others.
"""

from __future__ import annotations

import argparse
import time

from harness import cpu_description, radixlm_command, save_result, server
from workloads import WORKLOADS, run_workloads

SETTINGS = {
    "invariant": [],
    "compiled": ["--no-deterministic", "--enable-torch-compile"],
    "torch": ["--no-deterministic", "--cpu-kernels", "torch"],
    "torch-compiled": ["--no-deterministic", "--cpu-kernels", "torch", "--enable-torch-compile"],
}


def summary(results: dict, workloads: list[str]) -> list[dict]:
    rows = []
    for w in workloads:
        tput = {s: r[w]["output_throughput"] for s, r in results.items() if w in r and not r[w]["errors"]}
        others = {s: t for s, t in tput.items() if s != "invariant"}
        if "invariant" not in tput or not others:
            continue
        best = max(others, key=others.get)
        rows.append({"workload": w, **{s: round(t, 1) for s, t in tput.items()}, "fastest_other": best,
                     "invariant_over_fastest": round(tput["invariant"] / others[best], 3)})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workloads", nargs="+", default=list(WORKLOADS))
    ap.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    ap.add_argument("--flags", default="", help="server flags every setting gets (e.g. --quantization none)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    results = {}
    for s in args.settings:
        print(f"{s}: radixlm serve {' '.join(args.flags.split() + SETTINGS[s])}", flush=True)
        with server(radixlm_command(*args.flags.split(), *SETTINGS[s]), timeout=900) as url:
            results[s] = run_workloads(url, "radixlm", args.workloads)
    rows = summary(results, args.workloads)
    date = time.strftime("%Y-%m-%d %H:%M")
    print(f"\n{date}, {cpu_description()}, SmolLM2-135M-Instruct, flags: {args.flags or '(defaults)'}")
    print("| workload | " + " | ".join(f"{s} tok/s" for s in args.settings) + " | invariant / fastest other |")
    print("|---|" + "---|" * (len(args.settings) + 1))
    for r in rows:
        print(f"| {r['workload']} | " + " | ".join(str(r.get(s, "-")) for s in args.settings) +
              f" | {r['invariant_over_fastest']:.2f}x ({r['fastest_other']}) |")
    save_result(args.out, date=date, flags=args.flags, settings=SETTINGS, summary=rows, results=results)


if __name__ == "__main__":
    main()
