"""Builds radixlm's C++ CPU kernels once per content, and loads them.

The build folder is named by a digest of everything that decides the library's bytes: the sources and
headers, the flags, the compiler, torch's and Python's versions and the machine's architecture. Any number
of checkouts or virtual environments with the same kernels therefore share one build, and two with different
kernels never overwrite each other's. The sources are copied into the folder before the build, so the
compile commands (which name them) are the same whichever checkout built it. A finished build leaves a marker
beside the library; a later start that finds it loads the library directly, without the builder.

A first start says so in one log line before it compiles, then logs each source as it finishes, so a
server whose output is not a terminal does not sit silent for minutes.
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
import shutil
import subprocess
import sys
import threading
import time

import torch

from radixlm.kernels.cpu_info import usable_cores

NAME = "radixlm_cpu_kernels"
# the slowest to compile first (see _jobs_per_core)
SOURCES = ("cpu_matmul.cpp", "cpu_decode_attention.cpp", "cpu_token_bitmask.cpp", "cpu_norm_act.cpp",
           "cpu_decoder_layer.cpp", "cpu_rope_store.cpp", "cpu_layer_weights.cpp", "cpu_sample.cpp", "cpu_penalties.cpp")
# -ffp-contract=off: the compiler never fuses a multiply and an add on its own, so every path rounds alike
FLAGS = ("-O3", "-fopenmp", "-ffp-contract=off")
LDFLAGS = ("-fopenmp",)
MARKER = "built"  # written after a build succeeds; holds the digest
HERE = os.path.dirname(os.path.abspath(__file__))
log = logging.getLogger("radixlm.kernels")


def kernel_files(here: str = HERE) -> list[str]:
    """The files the library is compiled from: the sources and every header, sorted by name."""
    return sorted([os.path.join(here, s) for s in SOURCES] + glob.glob(os.path.join(here, "*.h")))


@functools.cache
def compiler_id() -> str:
    """The C++ compiler torch's builder runs ($CXX, else c++), as its --version's first line."""
    cxx = os.environ.get("CXX", "c++")
    try:
        out = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as e:
        return f"{cxx}: {e.__class__.__name__}"
    return f"{cxx}: {(out.stdout or out.stderr).splitlines()[0] if (out.stdout or out.stderr) else out.returncode}"


def content_digest(here: str = HERE) -> str:
    """16 hex digits over the kernels' files (names and bytes), flags, compiler, torch, Python and machine:
    equal for two checkouts of the same kernels, different as soon as one byte of them differs."""
    digest = hashlib.sha256()
    for path in kernel_files(here):
        with open(path, "rb") as f:
            digest.update(os.path.basename(path).encode() + b"\0" + f.read() + b"\0")
    for part in (*FLAGS, "|", *LDFLAGS, "|", compiler_id(), torch.__version__, sys.version.split()[0],
                 platform.machine()):
        digest.update(part.encode() + b"\0")
    return digest.hexdigest()[:16]


def extensions_root() -> str:
    """$TORCH_EXTENSIONS_DIR, else ~/.cache/torch_extensions, where torch's own builds go."""
    return os.environ.get("TORCH_EXTENSIONS_DIR") or os.path.join(os.path.expanduser("~"), ".cache",
                                                                  "torch_extensions")


def build_directory(here: str = HERE) -> str:
    """The build folder of these kernels: one per content digest."""
    return os.path.join(extensions_root(), f"{NAME}-{content_digest(here)}")


def is_built(folder: str) -> bool:
    return os.path.isfile(os.path.join(folder, MARKER)) and os.path.isfile(os.path.join(folder, f"{NAME}.so"))


def build_and_load(here: str = HERE) -> str:
    """Loads the kernels' library into torch.ops, building it first where this content was never built here;
    returns its folder. Raises where the build fails (no compiler, no ninja)."""
    folder = build_directory(here)
    with exclusive_build(folder):
        if is_built(folder):
            torch.ops.load_library(os.path.join(folder, f"{NAME}.so"))
            return folder
        _build(here, folder)
    return folder


def _build(here: str, folder: str) -> None:
    from torch.utils import cpp_extension

    log.warning("building radixlm's CPU kernels for this machine, once (%d sources, each for every instruction set "
                "of %s) in %s", len(SOURCES), platform.machine(), folder)
    start = time.monotonic()
    sources = _stage_sources(here, folder)
    with _jobs_per_core(), _progress(folder, start):
        cpp_extension.load(NAME, sources, extra_cflags=list(FLAGS), extra_ldflags=list(LDFLAGS),
                           build_directory=folder, is_python_module=False, verbose=False)
    with open(os.path.join(folder, MARKER), "w") as f:
        f.write(os.path.basename(folder).rsplit("-", 1)[1] + "\n")
    log.warning("built radixlm's CPU kernels in %.0f s; later starts load them from %s", time.monotonic() - start,
                folder)


def _stage_sources(here: str, folder: str) -> list[str]:
    """Copies the kernels' files into ``folder``/src (the same bytes the digest names) -> the sources there."""
    src = os.path.join(folder, "src")
    os.makedirs(src, exist_ok=True)
    for path in kernel_files(here):
        shutil.copyfile(path, os.path.join(src, os.path.basename(path)))
    return [os.path.join(src, s) for s in SOURCES]


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


@contextlib.contextmanager
def _progress(folder: str, start: float, every_s: float = 2.0):
    """Logs each object file as the build writes it ("3 of 8 sources compiled"); a watcher thread that only
    lists the folder (no torch work)."""
    done = threading.Event()

    def watch() -> None:
        seen = 0
        while not done.wait(every_s):
            count = sum(os.path.exists(os.path.join(folder, s.removesuffix(".cpp") + ".o")) for s in SOURCES)
            if count > seen:
                seen = count
                log.warning("radixlm's CPU kernels: %d of %d sources compiled (%.0f s)", count, len(SOURCES),
                            time.monotonic() - start)

    thread = threading.Thread(target=watch, name="radixlm-kernel-build", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
