"""The NEON path (kernels/cpu_vec_neon.h), which no machine here can load into torch: kernels/cpu_path_check.cpp
compiles the kernel bodies against the portable and the NEON vector layers with Debian's aarch64 cross
compiler, runs them under qemu-user on the same random inputs, and compares every output byte for byte. The
portable path is checked against torch by the rest of the suite, so equality carries that check over.

The ops' sources are also compiled for AArch64 against torch's headers. Not checked: linking and running the
ops inside torch on AArch64, the run-time choice of the path (getauxval's dotprod bit) on a real machine, and
the NEON path's speed."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest

KERNELS = os.path.join(os.path.dirname(__file__), "..", "kernels")
CXX, QEMU = shutil.which("aarch64-linux-gnu-g++"), shutil.which("qemu-aarch64")
needs_tools = pytest.mark.skipif(CXX is None or QEMU is None, reason="no aarch64 cross compiler or qemu-aarch64 "
                                 "(Debian: apt-get install g++-aarch64-linux-gnu qemu-user)")


@pytest.fixture(scope="module")
def harness(aarch64_builds) -> str:
    exe, results = aarch64_builds
    code, stderr = results[HARNESS]
    assert code == 0, stderr
    return exe


def run(exe: str, cpu: str) -> subprocess.CompletedProcess:
    return subprocess.run([QEMU, "-L", "/usr/aarch64-linux-gnu", "-cpu", cpu, exe], capture_output=True, text=True,
                          timeout=300)


@needs_tools
@pytest.mark.parametrize("cpu", ["neoverse-n1", "max"])
def test_neon_path_equals_the_portable_path_bit_for_bit(harness, cpu):
    out = run(harness, cpu)
    assert out.returncode == 0, out.stdout + out.stderr
    counts = re.search(r"^(\d+) passed, (\d+) failed$", out.stdout, re.M)
    assert counts and int(counts[1]) >= 70 and counts[2] == "0", out.stdout
    for kernel in ("int4 matmul", "int5 matmul", "int6 matmul", "int8 matmul", "int4 matmul, K-quant layout",
                   "int5 matmul, K-quant layout", "attention", "attention in stages", "RMSNorm", "silu * up", "RoPE q"):
        assert f"PASS {kernel}" in out.stdout


SOURCES = ["cpu_matmul.cpp", "cpu_decode_attention.cpp", "cpu_norm_act.cpp", "cpu_token_bitmask.cpp",
           "cpu_decoder_layer.cpp", "cpu_sample.cpp"]


HARNESS = "cpu_path_check.cpp"


@pytest.fixture(scope="module")
def aarch64_builds(tmp_path_factory) -> tuple[str, dict[str, tuple[int, str]]]:
    """The harness built and every op source compiled for AArch64, all at once (the compiles are independent;
    together they take the time of the slowest few, not of all six in turn): (the harness, source -> (return
    code, stderr))."""
    import sysconfig

    from torch.utils.cpp_extension import include_paths

    exe = str(tmp_path_factory.mktemp("neon") / "cpu_path_check")
    flags = [f"-I{p}" for p in [*include_paths(), sysconfig.get_paths()["include"]]]
    commands = {HARNESS: [CXX, "-std=c++17", "-O2", "-ffp-contract=off", "-Wall", "-Werror", "-o", exe],
                **{src: [CXX, "-std=c++17", "-fsyntax-only", "-fopenmp", "-ffp-contract=off", *flags] for src in SOURCES}}
    procs = {src: subprocess.Popen([*cmd, os.path.join(KERNELS, src)], stdout=subprocess.DEVNULL,
                                   stderr=subprocess.PIPE, text=True) for src, cmd in commands.items()}
    errors = {src: proc.communicate(timeout=600)[1] for src, proc in procs.items()}  # (reads as it waits)
    return exe, {src: (procs[src].returncode, errors[src]) for src in commands}


@needs_tools
@pytest.mark.parametrize("source", SOURCES)
def test_the_ops_compile_for_aarch64(aarch64_builds, source):
    """The ops' sources (the torch glue, the NEON namespaces, the aarch64 dispatch) compile for AArch64 against
    torch's headers (syntax and template instantiation; nothing is linked or run)."""
    code, stderr = aarch64_builds[1][source]
    assert code == 0, stderr[-3000:]
