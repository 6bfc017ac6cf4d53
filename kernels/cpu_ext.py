"""Builds and loads radixlm's C++ CPU kernels (cpu_quant_matmul, cpu_decode_attention, cpu_token_bitmask,
cpu_norm_act; shared code in cpu_simd.h) as the ``torch.ops.radixlm_cpu`` ops, so torch.compile calls them as
opaque kernels.

They are compiled on first use with torch's extension builder (about 30 s, then cached under
``TORCH_EXTENSIONS_DIR``, by default ~/.cache/torch_extensions). ``available()`` is False on CPUs without
AVX512-VNNI and where the build fails (no compiler): callers then keep torch's own ops.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os

import torch

REQUIRED_FLAGS = ("avx512f", "avx512dq", "avx512bw", "avx512vl", "avx512_vnni", "f16c")
SOURCES = ("cpu_quant_matmul.cpp", "cpu_decode_attention.cpp", "cpu_token_bitmask.cpp", "cpu_norm_act.cpp")
HEADERS = ("cpu_simd.h",)
log = logging.getLogger(__name__)


@functools.cache
def _cpu_flags() -> frozenset[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


@functools.cache
def available() -> bool:
    """Builds (once per machine) and loads the ops; False where the CPU or the build cannot have them."""
    if not set(REQUIRED_FLAGS) <= _cpu_flags():
        return False
    from torch.utils import cpp_extension

    here = os.path.dirname(__file__)
    # -fopenmp: at::parallel_for is header-inline and runs serially without it (the kernels' threads come
    # from torch's own libgomp, already loaded under the same soname)
    flags = ["-O3", "-fopenmp", "-mavx512f", "-mavx512dq", "-mavx512bw", "-mavx512vl", "-mavx512vnni", "-mf16c",
             "-mfma"]
    if has_bf16():  # bfloat16 dot products in the attention kernels
        flags += ["-mavx512bf16", "-DRADIXLM_AVX512_BF16"]
    flags.append(f"-DRADIXLM_HEADERS={_headers_digest(here)}")  # the builder versions by .cpp sources and flags
    try:
        cpp_extension.load("radixlm_cpu_kernels", [os.path.join(here, s) for s in SOURCES], extra_cflags=flags,
                           extra_ldflags=["-fopenmp"], is_python_module=False, verbose=False)
    except Exception as exc:  # no compiler, no ninja, ...: torch's ops stay in use
        log.warning("radixlm's CPU kernels did not build (%s); using torch's ops", exc)
        return False
    _register_fakes()
    return True


def _headers_digest(here: str) -> str:
    digest = hashlib.sha256()
    for name in HEADERS:
        with open(os.path.join(here, name), "rb") as f:
            digest.update(f.read())
    return digest.hexdigest()[:16]


def has_bf16() -> bool:
    """Whether the kernels are built with AVX512-BF16 (the bfloat16 attention paths, extend_attention)."""
    return "avx512_bf16" in _cpu_flags()


def _register_fakes() -> None:
    """Output shapes for torch.compile's tracing."""
    fake = torch.library.register_fake
    fake("radixlm_cpu::int4_linear")(lambda x, w, d, mn: x.new_empty(x.shape[0], 16 * d.shape[0]))  # 16-row tiles
    fake("radixlm_cpu::int8_linear")(lambda x, w, s: x.new_empty(x.shape[0], s.shape[0]))  # a scale per row
    fake("radixlm_cpu::decode_attention")(
        lambda q, k, v, idx, counts, prefix, member: q.new_empty(q.shape[0], q.shape[1] * q.shape[2]))
    fake("radixlm_cpu::extend_attention")(
        lambda q, k, v, table, seq_lens, ext_lens: q.new_empty(q.shape[0], q.shape[1] * q.shape[2]))
