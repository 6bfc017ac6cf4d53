"""The CPU as results and the dashboard name it: cores, model name, and the instruction sets that matter."""

from __future__ import annotations

import os


def usable_cores() -> int:
    """The CPUs this process may run on: its affinity mask (taskset, a container's cpuset), else all of them."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def core_budget() -> int:
    """The cores a server spreads its processes' threads over: OMP_NUM_THREADS where the user set it (the knob
    torch and every OpenMP program read), else the CPUs this process may run on."""
    omp = os.environ.get("OMP_NUM_THREADS", "")
    return int(omp) if omp.isdigit() and int(omp) > 0 else usable_cores()


def cpu_flags() -> set[str]:
    """The first CPU's flags from /proc/cpuinfo (empty where there is none)."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((set(line.split(":", 1)[1].split()) for line in f if line.startswith("flags")), set())
    except OSError:
        return set()


def cpu_model_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "unknown CPU")
    except OSError:
        return "unknown CPU"


def cpu_description() -> str:
    """e.g. '2-core AMD EPYC 7B13, AVX2 + FMA, no AVX512'."""
    flags = cpu_flags()
    if "avx512f" in flags:
        isa = "AVX512 (" + ", ".join(f for f in ("avx512_vnni", "avx512_bf16", "amx_tile") if f in flags) + ")"
    else:
        isa = "AVX2 + FMA, no AVX512" if "avx2" in flags else "no AVX2"
    return f"{usable_cores()}-core {cpu_model_name()}, {isa}"
