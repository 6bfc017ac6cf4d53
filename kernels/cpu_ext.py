"""Builds and loads radixlm's C++ CPU kernels (cpu_matmul, cpu_decode_attention, cpu_token_bitmask,
cpu_norm_act, cpu_sample, and the fused decoder layers built from them; their bodies in cpu_*_body.h, the
vector layers in cpu_vec_*.h) as the ``torch.ops.radixlm_cpu`` ops, so torch.compile calls them as opaque
kernels.

One build serves every CPU: each kernel body is compiled once per instruction set (``PATHS``: portable C++,
AVX2 + FMA + F16C, AVX2 with VNNI dot products in the matmuls, AVX512 with VNNI, and AVX512-BF16 for bfloat16
attention on x86-64; portable C++ and NEON with dotprod on AArch64, ``MACHINE_PATHS``) and every op takes the
path to run as its last argument.
``resolve("auto")`` gives the fastest path this CPU has; a path it lacks is a ValueError here and an error in
the op, never an illegal instruction. The build runs on first use (cpu_build.py: once per content, shared by
every checkout under ``TORCH_EXTENSIONS_DIR``, by default ~/.cache/torch_extensions, or ahead of time with
``radixlm build-kernels``); where it fails (no compiler), ``available()`` is False and callers keep torch's
own ops.
"""

from __future__ import annotations

import functools
import logging
import os
import platform
import sys

import torch
from tqdm import tqdm

from radixlm.kernels import cpu_build

PATHS = ("portable", "avx2", "avx512", "avx512_bf16", "neon", "avx2_vnni")  # the ops' isa argument is the index
PATH_NAMES = {"portable": "portable C++", "avx2": "AVX2 + FMA + F16C", "avx512": "AVX512 (F, DQ, BW, VL, VNNI)",
              "avx512_bf16": "AVX512 with VNNI and BF16", "neon": "NEON with dotprod (ARMv8.2)",
              "avx2_vnni": "AVX2 + FMA + F16C with 256-bit VNNI (AVX-VNNI, or AVX512-VNNI with VL)"}
_SLOWEST_FIRST = ("portable", "neon", "avx2", "avx2_vnni", "avx512", "avx512_bf16")
# the paths built for this machine's architecture, slowest first (a CPU of it runs some of them: supported())
_X86_PATHS = ("portable", "avx2", "avx2_vnni", "avx512", "avx512_bf16")
MACHINE_PATHS = {"x86_64": _X86_PATHS, "AMD64": _X86_PATHS, "aarch64": ("portable", "neon"),
                 "arm64": ("portable", "neon")}.get(platform.machine(), ("portable",))
CAPABILITY_ENV = "RADIXLM_CPU_CAPABILITY"  # the fastest path supported() reports, if set
log = logging.getLogger(__name__)


@functools.cache
def available() -> bool:
    """Builds (once per content: cpu_build.py) and loads the ops; False where the build fails."""
    bar = tqdm(total=1, desc="radixlm CPU kernels (built once per machine)", disable=not sys.stderr.isatty())
    try:
        cpu_build.build_and_load()
    except Exception as exc:  # no compiler, no ninja, ...: torch's ops stay in use
        log.warning("radixlm's CPU kernels did not build (%s); using torch's ops", exc)
        return False
    finally:
        bar.close()
    _register_fakes()
    return True


def takes(x: torch.Tensor, isa: int | None) -> bool:
    """Whether radixlm's C++ ops take these float32 rows (logits): on the CPU, each row contiguous, with the
    kernels (isa None: the caller runs without them)."""
    return isa is not None and x.device.type == "cpu" and x.dtype == torch.float32 and x.stride(1) == 1


@functools.cache
def supported() -> tuple[str, ...]:
    """The kernel paths this CPU runs, slowest first (empty if the kernels did not build), up to the path
    named in $RADIXLM_CPU_CAPABILITY if set: like torch's ATEN_CPU_CAPABILITY, it makes a CPU act as an
    older one (an AVX512 machine as an AVX2-only one, to test or time what such a CPU runs)."""
    if not available():
        return ()
    paths = tuple(p for p in _SLOWEST_FIRST if torch.ops.radixlm_cpu.isa_supported(PATHS.index(p)))
    cap = os.environ.get(CAPABILITY_ENV)
    if not cap:
        return paths
    if cap not in paths:
        raise ValueError(f"${CAPABILITY_ENV}: must be one of this CPU's paths {paths}, got {cap!r}")
    return paths[:paths.index(cap) + 1]


def resolve(choice: str) -> int | None:
    """--cpu-kernels -> the ops' isa argument: auto is the fastest path the CPU has (None, torch's ops, if
    the kernels did not build); torch is None; a named path must be supported."""
    if choice == "torch":
        return None
    paths = supported()
    if choice == "auto":
        return PATHS.index(paths[-1]) if paths else None
    if choice not in PATHS:
        raise ValueError(f"cpu_kernels must be 'auto', 'torch' or one of {PATHS}, got {choice!r}")
    if choice not in paths:
        hidden = f", ${CAPABILITY_ENV} is {os.environ[CAPABILITY_ENV]}" if os.environ.get(CAPABILITY_ENV) else ""
        raise ValueError(f"cpu_kernels: this CPU has no {PATH_NAMES[choice]} (it runs {', '.join(paths) or 'none'}"
                         f"{hidden})")
    return PATHS.index(choice)


def describe(isa: int | None) -> str:
    return "torch's ops" if isa is None else f"radixlm's {PATHS[isa]} kernels ({PATH_NAMES[PATHS[isa]]})"


def _register_fakes() -> None:
    """Output shapes for torch.compile's tracing."""
    fake = torch.library.register_fake
    fake("radixlm_cpu::int4_linear")(lambda x, w, d, mn, isa: x.new_empty(x.shape[0], 16 * d.shape[0]))
    for name in ("int2_linear", "int5_linear"):
        fake(f"radixlm_cpu::{name}")(lambda x, w, d, mn, isa: x.new_empty(x.shape[0], 16 * d.shape[0]))
    for name in ("int3_linear", "int6_linear", "int8_linear"):
        fake(f"radixlm_cpu::{name}")(lambda x, w, d, isa: x.new_empty(x.shape[0], 16 * d.shape[0]))
    fake("radixlm_cpu::int8_rows")(lambda w, d, ids, dtype: d.new_empty(ids.shape[0], 32 * d.shape[1], dtype=dtype))
    fake("radixlm_cpu::decode_attention")(
        lambda q, k, v, idx, counts, prefix, member, isa: q.new_empty(q.shape[0], q.shape[1] * q.shape[2]))
    fake("radixlm_cpu::extend_attention")(
        lambda q, k, v, table, seq_lens, ext_lens, isa: q.new_empty(q.shape[0], q.shape[1] * q.shape[2]))
