"""Builds and loads radixlm's C++ CPU kernels (cpu_matmul, cpu_decode_attention, cpu_token_bitmask,
cpu_norm_act, cpu_sample, and the fused decoder layers built from them; their bodies in cpu_*_body.h, the
vector layers in cpu_vec_*.h) as the ``torch.ops.radixlm_cpu`` ops, so torch.compile calls them as opaque
kernels.

One build serves every CPU: each kernel body is compiled once per instruction set (``PATHS``: portable C++,
AVX2 + FMA + F16C, AVX2 with VNNI dot products in the matmuls, AVX512 with VNNI, and AVX512-BF16 for bfloat16
attention on x86-64; portable C++ and NEON with dotprod on AArch64, ``MACHINE_PATHS``) and every op takes the
path to run as its last argument.
``resolve("auto")`` gives the fastest path this CPU has; a path it lacks is a ValueError here and an error in
the op, never an illegal instruction. The build runs on first use with torch's extension builder (cached
under ``TORCH_EXTENSIONS_DIR``, by default ~/.cache/torch_extensions); where it fails (no compiler),
``available()`` is False and callers keep torch's own ops.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import glob
import hashlib
import logging
import os
import platform
import sys
import time

import torch
from tqdm import tqdm

from radixlm.kernels.cpu_info import usable_cores

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
# the slowest to compile first (see _jobs_per_core)
SOURCES = ("cpu_matmul.cpp", "cpu_decode_attention.cpp", "cpu_token_bitmask.cpp", "cpu_norm_act.cpp",
           "cpu_decoder_layer.cpp", "cpu_layer_weights.cpp", "cpu_sample.cpp", "cpu_penalties.cpp")
# -ffp-contract=off: the compiler never fuses a multiply and an add on its own, so every path rounds alike
FLAGS = ("-O3", "-fopenmp", "-ffp-contract=off")
log = logging.getLogger(__name__)


@functools.cache
def available() -> bool:
    """Builds (once per machine) and loads the ops; False where the build fails."""
    from torch.utils import cpp_extension

    here = os.path.dirname(__file__)
    # -fopenmp: at::parallel_for is header-inline and runs serially without it (the kernels' threads come
    # from torch's own libgomp, already loaded under the same soname); the headers' digest is a flag
    # because the builder versions a build by its .cpp sources and flags only
    flags = [*FLAGS, f"-DRADIXLM_HEADERS={_headers_digest(here)}"]
    start = time.monotonic()
    bar = tqdm(total=1, desc="radixlm CPU kernels (built once per machine)", disable=not sys.stderr.isatty())
    try:
        folder = build_directory()
        with exclusive_build(folder), _jobs_per_core():
            cpp_extension.load("radixlm_cpu_kernels", [os.path.join(here, s) for s in SOURCES], extra_cflags=flags,
                               extra_ldflags=["-fopenmp"], build_directory=folder, is_python_module=False,
                               verbose=False)
    except Exception as exc:  # no compiler, no ninja, ...: torch's ops stay in use
        log.warning("radixlm's CPU kernels did not build (%s); using torch's ops", exc)
        return False
    finally:
        bar.close()
    if time.monotonic() - start > 2:  # it built (a cached build loads in well under that)
        log.info("built radixlm's CPU kernels in %.0f s", time.monotonic() - start)
    _register_fakes()
    return True


def takes(x: torch.Tensor, isa: int | None) -> bool:
    """Whether radixlm's C++ ops take these float32 rows (logits): on the CPU, each row contiguous, with the
    kernels (isa None: the caller runs without them)."""
    return isa is not None and x.device.type == "cpu" and x.dtype == torch.float32 and x.stride(1) == 1


def build_directory() -> str:
    """The kernels' build folder, under $TORCH_EXTENSIONS_DIR (default ~/.cache/torch_extensions) like torch's
    own builds, one per Python and torch version (a build links against both)."""
    base = os.environ.get("TORCH_EXTENSIONS_DIR") or os.path.join(os.path.expanduser("~"), ".cache",
                                                                   "torch_extensions")
    tag = f"py{sys.version_info.major}{sys.version_info.minor}-torch{torch.__version__.replace('+', '_')}"
    return os.path.join(base, f"radixlm_cpu_kernels-{tag}")


@contextlib.contextmanager
def exclusive_build(folder: str):
    """Holds an flock on ``folder`` for one process's build-or-load at a time; the kernel releases it when its
    holder dies. torch's own lock file is removed under it: a build killed midway (Ctrl-C on a first start)
    leaves that file behind, and every later start would wait on it forever; while this flock is held, no live
    build of ours holds it."""
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "radixlm.flock"), "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        with contextlib.suppress(FileNotFoundError):
            os.remove(os.path.join(folder, "lock"))
        yield


@contextlib.contextmanager
def _jobs_per_core():
    """One compile a core (MAX_JOBS, unless the user set it) in place of ninja's default of two more, so that the
    slowest source (cpu_matmul.cpp, first in SOURCES) has a core of its own while the others share the rest:
    on two cores that finished sooner than five compiles sharing them."""
    if "MAX_JOBS" in os.environ:
        yield
        return
    os.environ["MAX_JOBS"] = str(usable_cores())
    try:
        yield
    finally:
        os.environ.pop("MAX_JOBS", None)


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


def _headers_digest(here: str) -> str:
    digest = hashlib.sha256()
    for path in sorted(glob.glob(os.path.join(here, "*.h"))):
        with open(path, "rb") as f:
            digest.update(f.read())
    return digest.hexdigest()[:16]


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
