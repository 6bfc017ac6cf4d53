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


def _cpuinfo_field(name: str) -> str | None:
    """The first value of a /proc/cpuinfo field, the first CPU's (None where there is none)."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.split(":", 1)[0].strip() == name), None)
    except OSError:
        return None


def cpu_flags() -> set[str]:
    """The first CPU's flags from /proc/cpuinfo (empty where there is none)."""
    return set((_cpuinfo_field("flags") or "").split())


def cpu_model_name() -> str:
    """The model name, with the family and model numbers where the name alone is vague: a cloud VM's
    'AMD EPYC' is a Zen 1, 3 or 4 (family 23 model 1, family 25 model 1, family 25 model 17)."""
    name = _cpuinfo_field("model name") or "unknown CPU"
    family, model = _cpuinfo_field("cpu family"), _cpuinfo_field("model")
    return f"{name} (family {family} model {model})" if family and model else name


def cpu_description() -> str:
    """e.g. '2-core AMD EPYC 7B13, AVX2 + FMA, no AVX512'."""
    flags = cpu_flags()
    if "avx512f" in flags:
        isa = "AVX512 (" + ", ".join(f for f in ("avx512_vnni", "avx512_bf16", "amx_tile") if f in flags) + ")"
    else:
        isa = "AVX2 + FMA, no AVX512" if "avx2" in flags else "no AVX2"
    return f"{usable_cores()}-core {cpu_model_name()}, {isa}"
