"""PNG plots of the results files under benchmarks/results/<benchmark>/ (matplotlib: ``pip install -e ".[bench]"``).

    python benchmarks/plot.py benchmarks/results/*/*.json

Each JSON file gets its plots beside it (FILE*.png), by what it holds: run_peers.py results (output tok/s per
workload, systems side by side), bench_scaling.py results (decode against the bandwidth ceiling, throughput
against concurrency, TTFT and TPOT against context length), bench_quant.py results (engine decode rates),
bench_invariance.py (invariant against the fastest other setting), bench_prefix_ttft.py (TTFT against the
shared prefix, cache on and off), bench_dashboard.py (the tree API's size and time against the tree's size), soak.py (resident memory).
"""

from __future__ import annotations

import json
import os
import sys


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def peers(data: dict, stem: str) -> list[str]:
    plt = _plt()
    results = {s: r for s, r in data["results"].items() if "error" not in r}
    workloads = sorted({w for r in results.values() for w in r})
    fig, ax = plt.subplots(figsize=(9, 4.5))
    width = 0.8 / max(len(results), 1)
    for i, (system, r) in enumerate(results.items()):
        xs = [j + i * width for j in range(len(workloads))]
        ax.bar(xs, [r.get(w, {}).get("output_throughput", 0) for w in workloads], width, label=system)
    ax.set_xticks([j + width * (len(results) - 1) / 2 for j in range(len(workloads))], workloads)
    ax.set_ylabel("output tok/s")
    ax.set_title(f"Against the CPU peers: {data.get('cpu', '')}\n{data.get('date', '')}", fontsize=9)
    ax.legend(fontsize=8)
    return [_save(fig, f"{stem}-peers.png")]


def scaling(data: dict, stem: str) -> list[str]:
    plt = _plt()
    out = []
    models = data["results"]
    fig, ax = plt.subplots(figsize=(7, 4))
    names = [m["model"].removesuffix(".gguf") for m in models]
    xs = range(len(models))
    ax.bar([x - 0.2 for x in xs], [_fraction(m, data, "radixlm") * 100 for m in models], 0.4, label="radixlm")
    ax.bar([x + 0.2 for x in xs], [_fraction(m, data, "llama") * 100 for m in models], 0.4, label="llama.cpp")
    ax.set_xticks(list(xs), names)
    ax.set_ylabel("batch-1 decode, % of the read-bandwidth ceiling")
    ax.set_title(data["header"], fontsize=8)
    ax.legend()
    out.append(_save(fig, f"{stem}-decode.png"))
    for m in models:
        if "concurrency" in m:
            fig, ax = plt.subplots(figsize=(6, 4))
            conc = sorted(int(c) for c in m["concurrency"])
            ax.plot(conc, [m["concurrency"][str(c)] for c in conc], marker="o")
            ax.set_xscale("log", base=2)
            ax.set_xlabel("requests at once")
            ax.set_ylabel("output tok/s")
            ax.set_title(f"{m['model']}: throughput against concurrency (radixlm)", fontsize=9)
            out.append(_save(fig, f"{stem}-concurrency.png"))
        if "context" in m:
            out.append(_context(plt, m, stem))
    return out


def _fraction(m: dict, data: dict, who: str) -> float:
    """A model's batch-1 decode as a fraction of the ceiling: the run's median over rounds, or (runs before
    2026-12-03, one bandwidth for the whole run) computed from that bandwidth."""
    if f"{who}_fraction" in m:
        return m[f"{who}_fraction"]
    if who == "radixlm":
        return m["radixlm_decode"] / m["ceiling"]
    return m["llama_decode"] * m["llama_bytes_per_token"] / data["bandwidth"] if m.get("llama_decode") else 0.0


def _context(plt, m: dict, stem: str) -> str:
    ctx = sorted(int(c) for c in m["context"])
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    a.plot(ctx, [m["context"][str(c)][0] for c in ctx], marker="o", label="radixlm TTFT")
    b.plot(ctx, [m["context"][str(c)][1] * 1e3 for c in ctx], marker="o", label="radixlm TPOT")
    if "llama_context" in m:
        lc = m["llama_context"]
        a.plot(ctx, [(c - 32) / lc[str(c)][0] if lc[str(c)][0] else None for c in ctx], marker="s",
               label="llama.cpp prefill time")
        b.plot(ctx, [1e3 / lc[str(c)][1] if lc[str(c)][1] else None for c in ctx], marker="s", label="llama.cpp TPOT")
    for ax, label in ((a, "seconds"), (b, "ms per output token")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("context length")
        ax.set_ylabel(label)
        ax.legend(fontsize=8)
    fig.suptitle(f"{m['model']}: latency against context", fontsize=9)
    return _save(fig, f"{stem}-context.png")


def quant(data: dict, stem: str) -> list[str]:
    plt = _plt()
    engines = data["engines_tok_s"]
    fig, ax = plt.subplots(figsize=(9, 4.5))
    batches = [k for k in next(iter(engines.values())) if k != "startup_s"]
    width = 0.8 / len(batches)
    for i, b in enumerate(batches):
        ax.barh([j + i * width for j in range(len(engines))], [e[b] for e in engines.values()], width,
                label=f"batch {b}")
    ax.set_yticks([j + width * (len(batches) - 1) / 2 for j in range(len(engines))], list(engines), fontsize=8)
    ax.set_xlabel("decode tok/s")
    ax.set_title(f"{data['cpu']}, {data['date']}", fontsize=9)
    ax.legend()
    fig.tight_layout()
    return [_save(fig, f"{stem}-engines.png")]


def prefix_ttft(data: dict, stem: str) -> list[str]:
    plt = _plt()
    lengths = sorted(int(n) for n in data["results"])
    r = data["results"]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(lengths, [r[str(n)]["off"] * 1e3 for n in lengths], marker="o", label="cache off (flushed)")
    ax.plot(lengths, [r[str(n)]["on"] * 1e3 for n in lengths], marker="s", label="cache on (prefix cached)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel(f"shared prefix, tokens (+ {data['suffix']} new)")
    ax.set_ylabel("TTFT, ms")
    ax.set_title(data["header"], fontsize=8)
    ax.legend()
    return [_save(fig, f"{stem}.png")]


def invariance(data: dict, stem: str) -> list[str]:
    plt = _plt()
    rows = data["summary"]
    fig, ax = plt.subplots(figsize=(8, 4))
    xs = range(len(rows))
    ax.bar([x - 0.2 for x in xs], [r["invariant"] for r in rows], 0.4, label="invariant defaults")
    ax.bar([x + 0.2 for x in xs], [r[r["fastest_other"]] for r in rows], 0.4, label="fastest non-invariant setting")
    ax.set_xticks(list(xs), [r["workload"] for r in rows])
    ax.set_ylabel("output tok/s")
    ax.set_title(f"Batch invariance costs nothing: {data['cpu']}, {data['date']}", fontsize=9)
    ax.legend(fontsize=8)
    return [_save(fig, f"{stem}.png")]


def dashboard(data: dict, stem: str) -> list[str]:
    plt = _plt()
    rows = data.get("in_process")
    if not rows:
        return []
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.8))
    n = [r["prompts"] for r in rows]
    a.plot(n, [r["nodes"] for r in rows], marker="o", label="tree nodes")
    a.plot(n, [r["bytes"] for r in rows], marker="s", label="bytes per answer")
    b.plot(n, [r["ms_median"] for r in rows], marker="o", label="median ms per poll")
    for ax in (a, b):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("distinct prompts cached")
        ax.legend(fontsize=8)
    fig.suptitle(f"The tree API stays bounded (top {data['top']}): {data['header']}", fontsize=8)
    return [_save(fig, f"{stem}.png")]


def soak(data: dict, stem: str) -> list[str]:
    plt = _plt()
    minutes = [m[0] / 60 for m in data["memory"]]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(minutes, [m[1] for m in data["memory"]], marker=".", label="scheduler")
    ax.plot(minutes, [m[3] for m in data["memory"]], marker=".", label="API process")
    trend = data["trend_mb_per_min"]
    ax.set_xlabel("minute")
    ax.set_ylabel("resident memory, MB")
    ax.set_title(f"Soak: {data['header']}\ntrend after warm-up: scheduler {trend['scheduler']:+.2f} MB/min, "
                 f"API {trend['api']:+.2f} MB/min", fontsize=8)
    ax.legend()
    return [_save(fig, f"{stem}.png")]


PLOTTERS = {"prefix_ttft": prefix_ttft, "dashboard": dashboard, "soak": soak}


def _save(fig, path: str) -> str:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path


def main() -> None:
    for path in sys.argv[1:]:
        with open(path) as f:
            data = json.load(f)
        stem = os.path.splitext(path)[0]
        if data.get("kind") in PLOTTERS:
            made = PLOTTERS[data["kind"]](data, stem)
        elif "summary" in data and "settings" in data:
            made = invariance(data, stem)
        elif "engines_tok_s" in data:
            made = quant(data, stem)
        elif "radixlm_flags" in data:  # run_peers (its --rounds too)
            made = peers(data, stem)
        elif "bandwidth" in data or "rounds" in data:  # bench_scaling (one bandwidth, or one per round)
            made = scaling(data, stem)
        elif "results" in data:
            made = peers(data, stem)
        else:
            made = []
        for m in made:
            print(m)


if __name__ == "__main__":
    main()
